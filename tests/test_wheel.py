"""The wheel, end to end: `pip wheel . --no-build-isolation` (incremental in the
persistent build-wheel/), installed into a fresh venv, used from outside the
repository with no PYTHONPATH: `import torch` loads the tpu device (autoload
entry point), a module runs on tpu like on CPU, torch.compile(backend="tpu")
works, the metadata lists the extras, and a wheel run with another torch
fails with a clear ImportError.

torch itself is not reinstalled per run (that takes about 2 minutes here):
build-wheel/torch-env is a venv into which pip installed torch==<this torch's
exact version, e.g. 2.13.0+cpu> (and so its dependencies) once; the fresh venv sees it through one .pth line. So pip resolves the
wheel's `torch>=2.11,<2.14` against a real installed torch distribution, and
installs the wheel and its other dependencies (numpy, xla-cpu-pjrt) into the
fresh venv itself. TORCH_PJRT_SKIP_WHEEL_TEST=1 skips this test.
Timings: build-wheel/wheel_test_times.json."""
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build-wheel")
TORCH_ENV = os.path.join(BUILD, "torch-env")
PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.skipif(os.environ.get("TORCH_PJRT_SKIP_WHEEL_TEST") == "1",
                                reason="TORCH_PJRT_SKIP_WHEEL_TEST=1")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TORCH_PJRT_BUILD_DIR", "TORCH_PJRT_PLUGIN", "TORCH_DEVICE_BACKEND_AUTOLOAD",
                        "VIRTUAL_ENV", "PYTHONHOME")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def sh(cmd, timeout=1800, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def pip(python, *args, **kw):
    # This environment's pip, run for the target interpreter (the fresh venvs have none of their own).
    # clean_env: with PYTHONPATH at the repo (scripts/test.sh sets it) the target would see
    # the dev torch_pjrt-0.1.0.dist-info and pip would skip the wheel as "already installed".
    kw.setdefault("env", clean_env())
    return sh([sys.executable, "-m", "pip", "--python", python, "-q", *args], **kw)


def torch_env():
    """The venv holding only torch (and what torch needs), made once per torch version."""
    version = torch.__version__
    stamp = os.path.join(TORCH_ENV, "torch_version")
    if os.path.isfile(stamp) and open(stamp).read() == version:
        return None
    shutil.rmtree(TORCH_ENV, ignore_errors=True)
    t = time.time()
    sh([sys.executable, "-m", "venv", "--without-pip", TORCH_ENV])
    pip(os.path.join(TORCH_ENV, "bin", "python"), "install", f"torch=={version}")
    with open(stamp, "w") as f:
        f.write(version)
    return time.time() - t


CHECK = textwrap.dedent("""
    import importlib.metadata as md, json, os, sys
    import torch                                   # no `import torch_pjrt`: the entry point loads it
    assert "torch_pjrt" in sys.modules, "import torch did not load torch_pjrt"
    import torch_pjrt
    from torch_pjrt import _state
    pkg = os.path.dirname(torch_pjrt.__file__)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    with torch.no_grad():  # (a live autograd graph holding the weights would block Module.to's swap)
        ref = m(x)
    mt = m.to("tpu")
    eager = mt(x.to("tpu")).cpu()
    compiled = torch.compile(mt, backend="tpu")(x.to("tpu")).cpu()
    dist = md.distribution("torch_pjrt")
    dynamo = [e for e in md.entry_points(group="torch_dynamo_backends") if e.name == "tpu"]
    print("RESULT " + json.dumps({
        "package": pkg, "extension": _state.C.__file__, "prefix": sys.prefix,
        "torch": torch.__version__, "torch_file": torch.__file__,
        "eager_err": (eager - ref).abs().max().item(), "compiled_err": (compiled - ref).abs().max().item(),
        "compiled_graphs": torch_pjrt.metrics().get("compiled_graphs", 0),
        "plugin": torch_pjrt.plugin_info().get("name"),
        "extras": dist.metadata.get_all("Provides-Extra"), "requires": dist.requires,
        "entry_points": sorted([e.group, e.name, e.value] for e in dist.entry_points),
        "dynamo_dists": [str(e.dist._path) for e in dynamo],
    }))
""")


def test_wheel_installs_and_runs(tmp_path):
    times = {}
    dist = tmp_path / "dist"
    t = time.time()
    sh([sys.executable, "-m", "pip", "wheel", ROOT, "--no-build-isolation", "--no-deps", "-q", "-w", str(dist)],
       cwd=ROOT, env=clean_env(CCACHE_BASEDIR=ROOT))
    times["wheel_build_s"] = time.time() - t
    wheels = glob.glob(str(dist / "torch_pjrt-0.1.0-*.whl"))
    assert len(wheels) == 1, os.listdir(dist)
    times["wheel_mb"] = os.path.getsize(wheels[0]) / 2**20

    made = torch_env()
    if made is not None:
        times["torch_env_install_s"] = made

    venv = tmp_path / "venv"
    py = str(venv / "bin" / "python")
    t = time.time()
    sh([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    site = venv / "lib" / PYVER / "site-packages"
    (site / "_torch_env.pth").write_text(os.path.join(TORCH_ENV, "lib", PYVER, "site-packages") + "\n")
    pip(py, "install", wheels[0])
    times["venv_and_install_s"] = time.time() - t

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    t = time.time()
    r = sh([py, "-c", CHECK], cwd=outside, env=clean_env(), timeout=600)
    times["check_s"] = time.time() - t
    res = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert res["package"] == str(site / "torch_pjrt"), res["package"]       # the installed copy, not the repo
    assert os.path.dirname(res["extension"]) == res["package"]              # the .so inside the package
    assert res["torch"] == torch.__version__ and res["torch_file"].startswith(TORCH_ENV)
    assert res["eager_err"] < 1e-5 and res["compiled_err"] < 1e-5, res
    assert res["compiled_graphs"] >= 1
    assert res["plugin"] == "cpu"
    assert set(res["extras"]) >= {"tpu", "cuda", "hf", "assess"}
    assert any(q.startswith("torch") and ">=2.11" in q and "<2.14" in q for q in res["requires"]), res["requires"]
    assert any("libtpu==" in q and 'extra == "tpu"' in q for q in res["requires"])
    assert ["torch.backends", "tpu", "torch_pjrt:_autoload"] in res["entry_points"]
    assert ["torch_dynamo_backends", "tpu", "torch_pjrt._compile:tpu_backend"] in res["entry_points"]
    assert res["dynamo_dists"] and all(d.startswith(str(site)) for d in res["dynamo_dists"])

    # The same wheel with another torch: a clear ImportError naming both versions
    # (faked by editing the installed build info of this throwaway venv).
    info = site / "torch_pjrt" / "_build_info.py"
    assert f'TORCH_VERSION = "{torch.__version__}"' in info.read_text()
    info.write_text('TORCH_VERSION = "2.11.0+cpu"\n')
    r = subprocess.run([py, "-c", "import torch_pjrt"], cwd=outside, capture_output=True, text=True,
                       env=clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"), timeout=300)
    assert r.returncode != 0 and "ImportError" in r.stderr
    assert "2.11.0+cpu" in r.stderr and torch.__version__ in r.stderr, r.stderr[-2000:]
    # ... while `import torch` itself still works (a warning names torch_pjrt).
    r = subprocess.run([py, "-c", "import torch; print(torch.ones(2).sum().item())"], cwd=outside,
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0 and "2.0" in r.stdout, r.stderr[-2000:]
    assert "torch_pjrt" in r.stderr and "2.11.0+cpu" in r.stderr

    os.makedirs(BUILD, exist_ok=True)
    with open(os.path.join(BUILD, "wheel_test_times.json"), "w") as f:
        json.dump({k: round(v, 1) for k, v in times.items()}, f, indent=1)
    print("wheel test times:", {k: round(v, 1) for k, v in times.items()})
