"""Packaging in dev mode (PYTHONPATH=<repo>, the dist-info at the repository
root): `import torch` loads torch_pjrt through the "torch.backends" entry
point; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off; importing is quiet; a
broken plugin is a warning at `import torch`, an error at `import torch_pjrt`.
The installed wheel is tested in tests/test_wheel.py."""
import os
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(code, tmp_path, **env):
    """`code` in a fresh interpreter, from outside the repository, dev mode."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("TF_CPP_MIN_LOG_LEVEL", "TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCH_PJRT_PLUGIN")}
    full["PYTHONPATH"] = ROOT
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


def test_import_torch_autoloads_the_device(tmp_path):
    r = run("import sys, torch\n"
            "print(torch.ones(2, device='tpu') + 1)\n"
            "print('torch_pjrt' in sys.modules, torch.tpu.device_count() > 0)\n", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tensor([2., 2.], device='tpu:0')" in r.stdout
    assert "True True" in r.stdout


def test_autoload_off(tmp_path):
    r = run("import sys, torch\n"
            "print('loaded', 'torch_pjrt' in sys.modules)\n"
            "try:\n"
            "    torch.ones(2, device='tpu')\n"
            "    print('tpu is a device')\n"
            "except RuntimeError:\n"
            "    print('no tpu device')\n", tmp_path, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "loaded False" in r.stdout and "no tpu device" in r.stdout
    # ... and an explicit import still registers it.
    r = run("import torch, torch_pjrt; print(torch.ones(1, device='tpu').device)", tmp_path,
            TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0 and "tpu:0" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("code", ["import torch", "import torch_pjrt", "import torch_pjrt, torch"])
def test_import_is_quiet(tmp_path, code):
    # TF_CPP_MIN_LOG_LEVEL unset (run() drops it): XLA's start-up lines stay hidden.
    r = run(code + "; import torch; print(torch.ones(1, device='tpu').sum().item())", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == ""
    assert r.stdout == "1.0\n"


def test_broken_plugin_warns_at_import_torch(tmp_path):
    bad = tmp_path / "broken_plugin.so"
    bad.write_bytes(b"not a shared object")
    r = run("import sys, warnings\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import torch\n"
            "print('WARN', [str(x.message) for x in w if 'torch_pjrt' in str(x.message)])\n"
            "print('loaded', [m for m in sys.modules if m.startswith('torch_pjrt')])\n"
            "print(torch.ones(2).sum().item())\n"
            "try:\n"
            "    import torch_pjrt\n"
            "    print('imported')\n"
            "except Exception as e:\n"
            "    print('RAISED', type(e).__name__, e)\n", tmp_path, TORCH_PJRT_PLUGIN=str(bad))
    assert r.returncode == 0, r.stderr[-3000:]
    warn = [ln for ln in r.stdout.splitlines() if ln.startswith("WARN")][0]
    assert "the tpu device is not available" in warn and str(bad) in warn
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in warn
    assert "loaded []" in r.stdout  # nothing half-imported left behind
    assert "2.0" in r.stdout        # torch itself works
    raised = [ln for ln in r.stdout.splitlines() if ln.startswith("RAISED")]
    assert raised and "torch_pjrt" in raised[0] and str(bad) in raised[0]


def test_explicit_import_with_broken_plugin_raises(tmp_path):
    r = run("import torch_pjrt", tmp_path, TORCH_PJRT_PLUGIN=str(tmp_path / "missing.so"),
            TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode != 0
    assert "torch_pjrt" in r.stderr and "missing.so" in r.stderr


def test_torch_version_mismatch_is_a_clear_import_error(tmp_path):
    sys.path.insert(0, ROOT)
    try:
        from torch_pjrt import _loader
    finally:
        sys.path.remove(ROOT)
    info = tmp_path / "_build_info.py"
    info.write_text('TORCH_VERSION = "2.12.1+cpu"\n')
    with pytest.raises(ImportError) as e:
        _loader.check_torch(str(info), "2.13.0+cpu")
    assert "2.12.1+cpu" in str(e.value) and "2.13.0+cpu" in str(e.value) and "torch_pjrt" in str(e.value)
    _loader.check_torch(str(info), "2.12.1+cu130")  # same release, other local build: fine
    _loader.check_torch(str(tmp_path / "absent.py"), "2.13.0")  # an older dev build: no check


def test_pyproject_matches_dev_metadata():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    eps = project["entry-points"]
    assert eps["torch_dynamo_backends"] == {"tpu": "torch_pjrt._compile:tpu_backend"}
    assert eps["torch.backends"] == {"tpu": "torch_pjrt:_autoload"}
    dev = open(os.path.join(ROOT, "torch_pjrt-0.1.0.dist-info", "entry_points.txt")).read()
    assert "[torch.backends]\ntpu = torch_pjrt:_autoload" in dev
    assert "[torch_dynamo_backends]\ntpu = torch_pjrt._compile:tpu_backend" in dev
    assert set(project["optional-dependencies"]) == {"tpu", "cuda", "hf", "assess"}
    # Every pin in an extra or dependency equals requirements.txt's pin of that package.
    reqs = {}
    for line in open(os.path.join(ROOT, "requirements.txt")):
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            reqs[name.lower().replace("_", "-")] = version
    pins = list(project["dependencies"]) + [p for ps in project["optional-dependencies"].values() for p in ps]
    for pin in pins:
        if "==" in pin:
            name, version = pin.split("==")
            if name.lower() in reqs:
                assert reqs[name.lower()] == version, pin


def test_import_quiet_with_empty_log_level_and_loud_when_asked(tmp_path):
    r = run("import torch; print(torch.ones(1, device='tpu').sum().item())", tmp_path, TF_CPP_MIN_LOG_LEVEL="")
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    r = run("import os, torch; print(torch.ones(1, device='tpu').sum().item(), repr(os.environ['TF_CPP_MIN_LOG_LEVEL']))",
            tmp_path, TF_CPP_MIN_LOG_LEVEL="0")
    assert r.returncode == 0 and "1.0 '0'" in r.stdout
    assert "cpu_device_count" in r.stderr  # the user asked for XLA's info lines


def test_compile_backend_without_the_dist_info(tmp_path):
    # The package on a bare PYTHONPATH (no dist-info, so no entry point): the
    # "tpu" Dynamo backend is still there once Dynamo is imported, before or
    # after torch_pjrt (transformers compiles tpu decoding with backend="tpu").
    import shutil
    shutil.copytree(os.path.join(ROOT, "torch_pjrt"), tmp_path / "pkg" / "torch_pjrt")
    build = os.environ.get("TORCH_PJRT_BUILD_DIR", os.path.join(ROOT, "build"))
    for first in ("import torch_pjrt, torch._dynamo", "import torch._dynamo, torch_pjrt"):
        r = run(first + "\nimport torch\n"
                "f = torch.compile(lambda x: x * 2, backend='tpu')\n"
                "print(f(torch.ones(2, device='tpu')).cpu().tolist())\n", tmp_path,
                PYTHONPATH=str(tmp_path / "pkg"), TORCH_PJRT_BUILD_DIR=build, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        assert r.returncode == 0, r.stderr[-3000:]
        assert "[2.0, 2.0]" in r.stdout
