"""The static CUDA inventory (torch_pjrt.assess.inventory): every planted item in
tests/fixtures/cuda_project is found with its kind, effort, line and detail, a
clean file gives nothing, and hostile trees never make scan() raise."""
import os
import time

import pytest

from torch_pjrt.assess import inventory

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "cuda_project")

# (file, line, kind, effort, detail): everything the fixture plants, nothing more.
EXPECTED = {
    ("csrc/binding.cpp", 2, "cuda_source", "rewrite", "#include <ATen/cuda/CUDAContext.h>"),
    ("csrc/kernel.cu", 5, "cuda_source", "rewrite", "__global__ kernel scale_kernel"),
    ("csrc/kernel.cu", 17, "custom_op", "rewrite", "TORCH_LIBRARY_IMPL(fused, CUDA, ...)"),
    ("custom_ops.py", 3, "custom_op", "rewrite", "torch.ops.load_library"),
    ("custom_ops.py", 13, "custom_op", "rewrite", 'lib.impl(..., "CUDA")'),
    ("custom_ops.py", 16, "custom_op", "rewrite", 'torch.library.custom_op(..., "cuda")'),
    ("extras.py", 5, "gpu_package", "rewrite", "numba.cuda"),
    ("extras.py", 9, "cuda_api", "trivial", "PYTORCH_CUDA_ALLOC_CONF"),
    ("extras.py", 10, "cpp_extension", "rewrite", "torch.utils.cpp_extension.load"),
    ("extras.py", 11, "cpp_extension", "rewrite", "torch.utils.cpp_extension.load_inline"),
    ("extras.py", 15, "cuda_source", "rewrite", "@numba.cuda.jit kernel double"),
    ("extras.py", 21, "device_string", "trivial", 'torch.set_default_device("cuda")'),
    ("extras.py", 22, "cuda_call", "trivial", "use_cuda=True"),
    ("extras.py", 23, "cuda_api", "trivial", "torch.cuda.get_device_properties"),
    ("extras.py", 24, "cuda_api", "trivial", "torch.cuda.FloatTensor"),
    ("extras.py", 25, "cuda_api", "replace", "torch.amp.GradScaler() (defaults to cuda)"),
    ("extras.py", 26, "cudnn_flag", "trivial", "torch.nn.attention.sdpa_kernel"),
    ("extras.py", 26, "device_string", "trivial", 'torch.autocast("cuda")'),
    ("model.py", 5, "gpu_package", "replace", "flash_attn.flash_attn_func"),
    ("model.py", 6, "gpu_package", "replace", "apex.normalization.FusedLayerNorm"),
    ("model.py", 7, "gpu_package", "replace", "bitsandbytes"),
    ("model.py", 10, "gpu_package", "replace", "xformers.ops"),
    ("model.py", 14, "cudnn_flag", "trivial", "torch.backends.cudnn.benchmark"),
    ("model.py", 15, "cudnn_flag", "trivial", "torch.backends.cuda.matmul.allow_tf32"),
    ("model.py", 16, "cudnn_flag", "trivial", "torch.backends.cudnn.deterministic"),
    ("model.py", 17, "device_string", "trivial", '"cuda"'),
    ("model.py", 28, "cudnn_flag", "trivial", "torch.backends.cuda.sdp_kernel"),
    ("model.py", 33, "cuda_call", "trivial", ".cuda()"),
    ("model.py", 34, "device_string", "trivial", 'device="cuda:0"'),
    ("model.py", 35, "cuda_call", "trivial", '.to(torch.device("cuda", rank))'),
    ("model.py", 36, "cuda_call", "trivial", '.to(f"cuda:{...}")'),
    ("model.py", 37, "cuda_api", "trivial", "torch.cuda.is_available"),
    ("model.py", 37, "cuda_call", "trivial", ".is_cuda"),
    ("model.py", 38, "cuda_api", "trivial", "torch.cuda.synchronize"),
    ("model.py", 39, "cuda_call", "trivial", '.to("cuda")'),
    ("pyproject.toml", 6, "gpu_package", "replace", "flash-attn>=2.5"),
    ("pyproject.toml", 10, "gpu_package", "replace", "bitsandbytes"),
    ("pyproject.toml", 13, "gpu_package", "replace", "deepspeed"),
    ("requirements.txt", 2, "gpu_package", "trivial", "torch==2.3.0+cu121"),
    ("requirements.txt", 3, "gpu_package", "trivial",
     "--extra-index-url https://download.pytorch.org/whl/cu121"),
    ("requirements.txt", 5, "gpu_package", "replace", "xformers==0.0.26"),
    ("requirements.txt", 6, "gpu_package", "replace", "nvidia-ml-py>=12"),
    ("requirements.txt", 7, "gpu_package", "replace", "cupy-cuda12x"),
    ("setup.py", 6, "cpp_extension", "rewrite", "torch.utils.cpp_extension.CUDAExtension"),
    ("setup.py", 8, "gpu_package", "rewrite", "triton>=2.1"),
    ("train.py", 9, "cuda_api", "trivial", "CUDA_VISIBLE_DEVICES"),
    ("train.py", 13, "cuda_api", "replace", '"nccl"'),
    ("train.py", 14, "cuda_api", "trivial", "torch.cuda.set_device"),
    ("train.py", 15, "cuda_api", "trivial", "torch.cuda.manual_seed"),
    ("train.py", 16, "cuda_api", "replace", 'torch.amp.GradScaler("cuda")'),
    ("train.py", 17, "cuda_api", "trivial", "torch.cuda.Event"),
    ("train.py", 18, "cuda_api", "trivial", "torch.cuda.Stream"),
    ("train.py", 20, "cuda_api", "trivial", "torch.cuda.amp.autocast"),
    ("train.py", 23, "cuda_api", "replace", "torch.cuda.CUDAGraph"),
    ("train.py", 24, "cuda_api", "trivial", "torch.cuda.max_memory_allocated"),
    ("train.py", 24, "cuda_api", "trivial", "torch.cuda.memory_allocated"),
    ("train.py", 25, "cuda_api", "trivial", "torch.cuda.empty_cache"),
    ("train.py", 26, "cuda_api", "trivial", "torch.cuda.nvtx.range_push"),
    ("train.py", 27, "device_string", "trivial", 'map_location="cuda"'),
    ("triton_ops.py", 2, "triton_kernel", "rewrite", "import triton"),
    ("triton_ops.py", 3, "triton_kernel", "rewrite", "import triton.language"),
    ("triton_ops.py", 6, "triton_kernel", "rewrite", "@triton.autotune @triton.jit kernel add_kernel"),
}

# Suggestions that name the replacement (spot checks of the wording that matters).
SUGGESTIONS = {
    ("model.py", 38): "torch.tpu.synchronize",
    ("model.py", 5): "scaled_dot_product_attention",
    ("model.py", 6): "nn.LayerNorm",
    ("train.py", 15): "torch.tpu.manual_seed",
    ("train.py", 16): "GradScaler('tpu')",
    ("train.py", 20): "torch.autocast('tpu'",
    ("train.py", 24): "torch.tpu.",
    ("requirements.txt", 6): "torch.tpu.memory_stats",
    ("pyproject.toml", 13): "FSDP2",
    ("csrc/kernel.cu", 5): "Pallas",
}


@pytest.fixture(scope="module")
def report():
    return inventory.scan([FIXTURE], root=FIXTURE)


def test_finds_every_planted_item_and_nothing_else(report):
    found = {(i["file"], i["line"], i["kind"], i["effort"], i["detail"]) for i in report["items"]}
    assert found - EXPECTED == set(), "unexpected items"
    assert EXPECTED - found == set(), "missed items"
    assert {e[2] for e in EXPECTED} == set(inventory.KINDS)     # the fixture covers every kind


def test_report_shape(report):
    items = report["items"]
    assert len(items) == len(EXPECTED)
    assert items == sorted(items, key=lambda i: (i["file"], i["line"], i["kind"], i["detail"]))
    assert all(set(i) == {"file", "line", "kind", "detail", "effort", "suggestion"} for i in items)
    assert all(i["suggestion"] for i in items)
    counts = {e: sum(1 for x in EXPECTED if x[3] == e) for e in inventory.EFFORTS}
    assert report["summary"] == counts
    assert report["files_scanned"] == 11      # 7 .py, .cu, .cpp, requirements.txt, pyproject.toml
    assert report["packages_scanned"] == [] and report["skipped"] == []
    assert report["truncated"] is False and report["error"] is None


def test_suggestions_name_the_replacement(report):
    by_place = {}
    for i in report["items"]:
        by_place.setdefault((i["file"], i["line"]), []).append(i["suggestion"])
    for place, text in SUGGESTIONS.items():
        assert any(text in s for s in by_place[place]), (place, by_place[place])


def test_clean_file_gives_nothing():
    r = inventory.scan([os.path.join(FIXTURE, "clean_model.py")])
    assert r["files_scanned"] == 1 and r["items"] == [] and r["skipped"] == []
    assert r["summary"] == {"trivial": 0, "replace": 0, "rewrite": 0}


def test_duplicate_paths_are_scanned_once():
    once = inventory.scan([FIXTURE], root=FIXTURE)
    twice = inventory.scan([FIXTURE, FIXTURE, os.path.join(FIXTURE, "model.py")], root=FIXTURE)
    assert twice["items"] == once["items"] and twice["files_scanned"] == once["files_scanned"]


def test_imported_packages():
    assert inventory.imported_packages([FIXTURE]) == [
        "apex", "bitsandbytes", "flash_attn", "numba", "setuptools", "torch", "triton", "xformers"]
    # `from model import build` in train.py is the workload's own module
    assert inventory.imported_packages(os.path.join(FIXTURE, "train.py")) == ["torch"]


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_hostile_files(tmp_path, monkeypatch):
    d = tmp_path / "w"
    _write(str(d / "ok.py"), b"y = x.cuda()\n")
    _write(str(d / "bad_syntax.py"), b"def f(:\n    x.cuda()\n")
    _write(str(d / "binary.py"), b"\x00\x01\x02 x.cuda()")
    _write(str(d / "huge.py"), b"x = 1\n" * 8000)
    _write(str(d / "latin1.py"), b"# caf\xe9 au lait\nz = y.to('cuda')\n")
    _write(str(d / "deep.py"), b"y" + b".cuda()" * 3000 + b"\n")
    _write(str(d / "denied.py"), b"x.cuda()\n")
    _write(str(d / "notes.md"), b"model.cuda()\n")          # not a source file: not read
    os.symlink(str(d / "missing.py"), str(d / "dangling.py"))
    os.symlink(str(d), str(d / "loop"))                      # a directory loop
    if hasattr(os, "mkfifo"):
        os.mkfifo(str(d / "pipe.py"))                        # opening it would block

    real_open = open

    def deny(path, *a, **k):
        if str(path).endswith("denied.py"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr(inventory, "open", deny, raising=False)
    r = inventory.scan([str(d), str(tmp_path / "nowhere")], root=str(d), max_bytes=30000)
    reasons = {s["file"]: s["reason"] for s in r["skipped"]}
    assert reasons["bad_syntax.py"].startswith("syntax error: line 1")
    assert reasons["binary.py"] == "binary file"
    assert reasons["huge.py"].startswith("larger than 30000 bytes")
    assert reasons["dangling.py"].startswith("unreadable")
    assert reasons["denied.py"].startswith("unreadable")
    assert reasons["deep.py"] == "nested too deeply to parse"
    assert reasons["../nowhere"] == "not found"
    if hasattr(os, "mkfifo"):
        assert reasons["pipe.py"] == "not a regular file"
    assert [(i["file"], i["line"], i["detail"]) for i in r["items"]] == [
        ("latin1.py", 2, '.to("cuda")'), ("ok.py", 1, ".cuda()")]
    assert r["error"] is None


def test_late_nul_byte_is_binary(tmp_path):
    _write(str(tmp_path / "late_nul.py"), b"x.cuda()\n" + b" " * 9000 + b"\x00\n")
    r = inventory.scan([str(tmp_path)], root=str(tmp_path))
    assert r["skipped"] == [{"file": "late_nul.py", "reason": "binary file"}] and r["items"] == []


def test_hostile_patterns_scan_in_linear_time(tmp_path):
    n = 300_000           # quadratic matching would take hours at this size
    _write(str(tmp_path / "a.cu"), b"__global__ " + b"a" * n + b"\n/* never closed " + b"/*" * n)
    _write(str(tmp_path / "b.cpp"), b"x <<< " + b"/*" * n)
    _write(str(tmp_path / "pyproject.toml"), b"[" + b" " * n + b"\n" + b"x" * n + b" = 1\n")
    _write(str(tmp_path / "requirements.txt"), b"a-" * n + b"cu12\n")
    _write(str(tmp_path / "c.py"), b"x = '" + b"cuda" * n + b"'\n" + b"import a, " * 1000 + b"b\n")
    started = time.perf_counter()
    r = inventory.scan([str(tmp_path)], root=str(tmp_path))
    assert time.perf_counter() - started < 2
    assert r["error"] is None and r["files_scanned"] == 5


def test_never_raises():
    for bad in (None, [123], [b"\xff"], 42, os.devnull):
        r = inventory.scan(bad, packages=[None])
        assert set(r) >= {"files_scanned", "packages_scanned", "items", "summary"}
    assert inventory.scan([123])["error"].startswith("TypeError")
    assert inventory.imported_packages([123]) == []


def test_file_cap(tmp_path):
    for n in range(5):
        _write(str(tmp_path / f"m{n}.py"), b"x.cuda()\n")
    r = inventory.scan([str(tmp_path)], root=str(tmp_path), max_files=3)
    assert r["files_scanned"] == 3 and r["truncated"] is True and r["max_files"] == 3
    assert [i["file"] for i in r["items"]] == ["m0.py", "m1.py", "m2.py"]


def test_walk_cap(tmp_path, monkeypatch):
    for n in range(10):
        _write(str(tmp_path / f"data{n}.md"), b"x.cuda()\n")
    monkeypatch.setattr(inventory, "MAX_WALK", 4)
    r = inventory.scan([str(tmp_path)])
    assert r["truncated"] is True and r["files_scanned"] == 0


def test_own_package_named_like_a_gpu_package_is_not_one(tmp_path):
    # causal-conv1d's repository imports its own causal_conv1d package
    _write(str(tmp_path / "causal_conv1d" / "__init__.py"), b"from causal_conv1d.ops import conv\n")
    _write(str(tmp_path / "bench.py"), b"import causal_conv1d\nimport flash_attn\n")
    r = inventory.scan([str(tmp_path)], root=str(tmp_path))
    assert [(i["file"], i["detail"]) for i in r["items"]] == [("bench.py", "flash_attn")]
    assert inventory.imported_packages([str(tmp_path)]) == ["flash_attn"]


def test_packages(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _write(str(site / "fakegpu_pkg" / "__init__.py"), b"from .ops import f\n")
    _write(str(site / "fakegpu_pkg" / "ops.py"), b"import torch\n\ndef f(x):\n    return x.cuda()\n")
    _write(str(site / "fakegpu_pkg" / "k.cu"), b"__global__ void k() {}\n")
    _write(str(site / "single_mod.py"), b"import torch\ntorch.cuda.synchronize()\n")
    monkeypatch.syspath_prepend(str(site))
    names = ["fakegpu_pkg", "single_mod", "torch", "os", "numpy", "flash_attn", "no_such_pkg_xyz"]
    r = inventory.scan([], packages=names)
    assert r["packages_scanned"] == ["fakegpu_pkg", "single_mod"]
    assert [(i["file"], i["line"], i["kind"]) for i in r["items"]] == [
        ("fakegpu_pkg/k.cu", 1, "cuda_source"), ("fakegpu_pkg/ops.py", 4, "cuda_call"),
        ("single_mod.py", 2, "cuda_api")]
    skipped = {s["package"]: s["reason"] for s in r["packages_skipped"]}
    assert skipped == {"torch": "known to run on CPU as is", "os": "standard library",
                       "numpy": "known to run on CPU as is",
                       "flash_attn": "GPU-only package: listed where it is imported",
                       "no_such_pkg_xyz": "not installed"}


def test_requirement_spellings():
    text = "\n".join([
        "-r base.txt", "-e git+https://example.invalid/NVIDIA/apex.git#egg=apex", "flash_attn==2.5.8",
        "torch>=2.1", "nvidia-cudnn-cu12", "cudf-cu12==24.4", "faiss-gpu", "triton ; sys_platform == 'linux'",
        "bitsandbytes-cuda117", "numpy  # not a gpu package", "Flash-Attn[all]>=2"])
    found = inventory._scan_requirements(text, "requirements.txt")
    assert [(line, effort) for line, _, _, effort, _ in found] == [
        (2, "replace"), (3, "replace"), (5, "replace"), (6, "replace"), (7, "replace"), (8, "rewrite"),
        (9, "replace"), (11, "replace")]


def test_workload_targets_for_a_file():
    t = inventory.workload_targets(os.path.join(FIXTURE, "train.py") + ":train")
    assert t["error"] is None and t["root"] == FIXTURE
    # train.py, the model.py it imports, and the project's build/dependency files
    assert [os.path.relpath(p, FIXTURE) for p in t["paths"]] == [
        "train.py", "model.py", "pyproject.toml", "requirements.txt", "setup.py"]
    assert t["packages"] == ["apex", "bitsandbytes", "flash_attn", "setuptools", "torch", "xformers"]
    # extras.py names its C++/CUDA sources (cpp_extension.load): they are scanned too
    extras = inventory.workload_targets(os.path.join(FIXTURE, "extras.py"))["paths"]
    assert {"csrc/binding.cpp", "csrc/kernel.cu"} <= {os.path.relpath(p, FIXTURE) for p in extras}
    r = inventory.scan(**{k: t[k] for k in ("paths", "packages", "root")})
    assert {i["file"] for i in r["items"]} == {"train.py", "model.py", "pyproject.toml",
                                               "requirements.txt", "setup.py"}
    assert r["packages_scanned"] == []     # all CPU-safe, GPU-only (listed at imports) or absent


def test_workload_targets_for_a_module(tmp_path, monkeypatch):
    _write(str(tmp_path / "wpkg" / "__init__.py"), b"")
    _write(str(tmp_path / "wpkg" / "models" / "__init__.py"), b"from .gpt import GPT\n")
    _write(str(tmp_path / "wpkg" / "models" / "gpt.py"), b"from ..ops import fused\nimport torch\n")
    _write(str(tmp_path / "wpkg" / "ops.py"), b"import triton\n")
    _write(str(tmp_path / "wpkg" / "unused.py"), b"x.cuda()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    t = inventory.workload_targets("wpkg.models:GPT")
    assert t["root"] == str(tmp_path) and t["packages"] == ["torch", "triton"]
    assert [os.path.relpath(p, tmp_path) for p in t["paths"]] == [
        "wpkg/models/__init__.py", "wpkg/models/gpt.py", "wpkg/__init__.py", "wpkg/ops.py"]
    assert inventory.workload_targets("no_such_module_xyz:f")["error"] == "not found: no_such_module_xyz"
    assert inventory.workload_targets(None)["error"].startswith("TypeError")


def test_function_suffix_is_stripped():
    strip = inventory._strip_function
    assert strip("a/b.py:fn") == "a/b.py" and strip("pkg.mod:Class.fn") == "pkg.mod"
    assert strip("a/b.py") == "a/b.py" and strip("C:\\w\\b.py") == "C:\\w\\b.py"
