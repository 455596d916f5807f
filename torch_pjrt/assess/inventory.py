"""Static inventory of the CUDA-specific code in a workload (report.json's "inventory").

Reads the workload's own source tree (and, on request, the source of packages it
imports) without importing or running any of it, and lists every place that ties
it to NVIDIA GPUs. Nothing here needs torch_pjrt, torch or a device.

What is found (the item "kind"):

  cuda_call      ``x.cuda()``, ``x.to("cuda")``, ``x.to(torch.device("cuda"))``,
                 ``x.is_cuda``, ``use_cuda=True``-style switches
  cuda_api       ``torch.cuda.*`` (synchronize, amp, Stream/Event, memory APIs,
                 seeds, graphs, nvtx, ...), the "nccl" backend, CUDA environment
                 variables (CUDA_VISIBLE_DEVICES, PYTORCH_CUDA_ALLOC_CONF, NCCL_*)
  device_string  "cuda"/"cuda:0" literals (also f"cuda:{rank}"), ``device="cuda"``,
                 ``torch.device("cuda")``, ``torch.autocast("cuda")``
  cudnn_flag     ``torch.backends.cudnn.*``, ``torch.backends.cuda.*`` (allow_tf32,
                 sdp_kernel, enable_flash_sdp, ...), ``torch.nn.attention.sdpa_kernel``
  cpp_extension  ``torch.utils.cpp_extension`` CUDAExtension, ``load`` with .cu
                 sources or with_cuda=True, ``load_inline`` with cuda_sources.
                 BuildExtension alone is not listed: it builds CPU extensions too.
  cuda_source    .cu/.cuh files: one item per ``__global__`` kernel; C/C++ files with
                 kernels, ``<<<...>>>`` launches or CUDA headers
  triton_kernel  ``import triton``, functions decorated ``@triton.jit`` /
                 ``@triton.autotune`` / ``@triton.heuristics``
  custom_op      ``torch.library`` impls registered for CUDA (impl, register_kernel,
                 custom_op(device_types="cuda"), Library(..., "CUDA")),
                 ``TORCH_LIBRARY_IMPL(ns, CUDA, m)`` in C++, ``torch.ops.load_library``
  gpu_package    imports and requirements (requirements*.txt, pyproject.toml,
                 setup.py install_requires) of GPU-only packages: GPU_PACKAGES below,
                 any nvidia-* wheel, "-cu12"/"-cuda12x" builds, torch "+cuXXX" wheels

Effort classes:

  trivial  a mechanical edit: device strings, .cuda(), torch.cuda calls that have a
           torch.tpu counterpart (named in the suggestion), cudnn flags (drop them)
  replace  swap a GPU-only library or API for a named PyTorch/tpu equivalent
  rewrite  a custom kernel (.cu sources, CUDA extensions, Triton kernels, CUDA
           impls of custom ops): rewrite it as a StableHLO/JAX (Pallas) kernel or
           express it in PyTorch ops

Python files are parsed with `ast` (import aliases resolved, so `from torch import
cuda; cuda.synchronize()` counts; comments and docstrings never do); a file with no
CUDA-related word and no GPU-package import is not parsed at all. C++/CUDA files and
requirement files are read with linear-time patterns.

Public API: scan(paths, packages=(), root=None), imported_packages(paths) and
workload_targets(source) (scan()'s arguments for "path/to/file.py:fn" or "pkg.mod:fn").
Neither raises on bad input: unreadable, binary, huge or unparsable files are
listed under "skipped" with the reason.
"""
import ast
import bisect
import importlib.util
import os
import re
import stat
import sys

__all__ = ["scan", "imported_packages", "workload_targets", "GPU_PACKAGES", "KINDS", "EFFORTS"]

KINDS = ("cuda_call", "cuda_api", "device_string", "cudnn_flag", "cpp_extension",
         "cuda_source", "triton_kernel", "custom_op", "gpu_package")
EFFORTS = ("trivial", "replace", "rewrite")

MAX_FILES = 2000           # files scanned per call (workload first, then packages)
MAX_BYTES = 2_000_000      # larger files are generated or data, not code to migrate
MAX_ITEMS = 10_000         # keeps report.json readable on a hostile tree
MAX_WALK = 200_000         # directory entries looked at, relevant or not (a path like / or /proc)

REWRITE = "rewrite as a StableHLO/JAX (Pallas) kernel or express it in PyTorch ops"
_SDPA = "torch.nn.functional.scaled_dot_product_attention (runs on tpu)"
_SERVE = ("a CUDA inference engine: serve the model with torch.compile(model, backend='tpu') "
          "and torch_pjrt.bucketed shapes")
_QUANT = ("CUDA-only quantized kernels: load bfloat16 weights (or quantize with torchao "
          "int8 weight-only) and run plain nn.Linear")
_NVML = ("NVML (GPU monitoring): torch.tpu.memory_stats / mem_get_info / "
         "get_device_properties(i).total_memory; utilization and temperature have no counterpart")
_DROP_CUDA_WHEEL = "a CUDA runtime wheel: drop it (the PJRT plugin brings its own runtime)"

# GPU-only packages: import name -> (pip names, effort, suggestion). Import names may
# be dotted where only a submodule is GPU-only (numba.cuda, torchao.sparsity).
GPU_PACKAGES = {
    "flash_attn": (("flash-attn",), "replace", _SDPA),
    "flash_attn_interface": (("flash-attn-3",), "replace", _SDPA),
    "xformers": (("xformers",), "replace",
                 "xformers.ops.memory_efficient_attention -> " + _SDPA + " (attn_bias -> attn_mask)"),
    "flashinfer": (("flashinfer", "flashinfer-python"), "replace", _SDPA),
    "sageattention": (("sageattention",), "replace", _SDPA),
    "apex": (("apex",), "replace",
             "FusedAdam -> torch.optim.AdamW(fused=True); FusedLayerNorm/FusedRMSNorm -> "
             "nn.LayerNorm/nn.RMSNorm; apex.amp -> torch.autocast('tpu', dtype=torch.bfloat16)"),
    "amp_C": ((), "replace", "apex's fused CUDA kernels: torch.optim.AdamW(fused=True) / PyTorch ops"),
    "fused_layer_norm_cuda": ((), "replace", "apex's CUDA LayerNorm: nn.LayerNorm"),
    "bitsandbytes": (("bitsandbytes",), "replace",
                     "8-bit optimizers -> torch.optim.AdamW or torchao.optim.AdamW8bit; "
                     "Linear8bitLt/Linear4bit -> nn.Linear in bfloat16 (or torchao quantization)"),
    "deepspeed": (("deepspeed",), "replace",
                  "ZeRO sharding -> torch.distributed FSDP2 (fully_shard); its fused optimizers -> "
                  "torch.optim.AdamW(fused=True); deepspeed.ops kernels are CUDA-only"),
    "megatron": (("megatron-core",), "replace",
                 "tensor/pipeline parallelism -> torch.distributed.tensor (DTensor); its fused "
                 "kernels need apex/transformer_engine"),
    "transformer_engine": (("transformer-engine",), "replace",
                           "nn.Linear/nn.LayerNorm under torch.autocast('tpu', dtype=torch.bfloat16), "
                           "or torchao.float8 for FP8 training (torch._scaled_mm runs on tpu)"),
    "cupy": (("cupy",), "replace",
             "torch tensor ops on tpu (or numpy on the host); RawKernel/ElementwiseKernel code "
             "must be rewritten in PyTorch ops"),
    "cupyx": ((), "replace", "torch / torch.fft / torch.sparse ops on tpu"),
    "pycuda": (("pycuda",), "rewrite", "kernels compiled by PyCUDA: " + REWRITE),
    "numba.cuda": ((), "rewrite", "numba.cuda kernels: " + REWRITE),
    "cuda": (("cuda-python", "cuda-bindings", "cuda-core"), "replace",
             "CUDA driver/runtime bindings: use torch.tpu (device_count, synchronize, mem_get_info) "
             "and drop the driver calls"),
    "pynvml": (("pynvml", "nvidia-ml-py", "nvidia-ml-py3"), "replace", _NVML),
    "GPUtil": (("gputil",), "replace", _NVML),
    "gpustat": (("gpustat",), "replace", _NVML),
    "nvitop": (("nvitop",), "replace", _NVML),
    "nvtx": (("nvtx",), "replace", "torch.profiler.record_function"),
    "tensorrt": (("tensorrt",), "replace",
                 "torch.compile(model, backend='tpu') (XLA compiles the whole graph)"),
    "torch_tensorrt": (("torch-tensorrt",), "replace", "torch.compile(model, backend='tpu')"),
    "tensorrt_llm": (("tensorrt-llm",), "replace", _SERVE),
    "nvidia.dali": ((), "replace",
                    "torch.utils.data.DataLoader with CPU transforms (torchvision.transforms.v2)"),
    "nvidia": ((), "replace", _DROP_CUDA_WHEEL),
    "cutlass": (("nvidia-cutlass",), "rewrite", "CUTLASS kernels: " + REWRITE),
    "deep_gemm": (("deep-gemm",), "replace", "torch.matmul / nn.Linear in bfloat16"),
    "triton": (("triton",), "rewrite", "Triton kernels run on GPUs only: " + REWRITE),
    "vllm": (("vllm",), "replace", _SERVE),
    "sglang": (("sglang",), "replace", _SERVE),
    "lmdeploy": (("lmdeploy",), "replace", _SERVE),
    "exllamav2": (("exllamav2",), "replace", _QUANT),
    "auto_gptq": (("auto-gptq",), "replace", _QUANT),
    "gptqmodel": (("gptqmodel",), "replace", _QUANT),
    "awq": (("autoawq",), "replace", _QUANT),
    "awq_ext": (("autoawq-kernels",), "replace", _QUANT),
    "eetq": (("eetq",), "replace", _QUANT),
    "liger_kernel": (("liger-kernel",), "replace",
                     "plain PyTorch modules (nn.CrossEntropyLoss, nn.RMSNorm, F.silu, ...) under "
                     "torch.compile(backend='tpu')"),
    "unsloth": (("unsloth",), "replace", "transformers + peft without unsloth's Triton patches"),
    "mamba_ssm": (("mamba-ssm",), "replace",
                  "a selective scan in PyTorch ops (the package's selective_scan_ref shows the math)"),
    "causal_conv1d": (("causal-conv1d",), "replace",
                      "nn.Conv1d(groups=channels, padding=kernel_size - 1), dropping the last "
                      "kernel_size - 1 outputs"),
    "fbgemm_gpu": (("fbgemm-gpu", "fbgemm-gpu-genai"), "replace", "nn.EmbeddingBag and PyTorch ops"),
    "torchao.sparsity": ((), "replace", "dense weights (2:4 sparsity uses CUDA cuSPARSELt kernels)"),
    "cudf": (("cudf",), "replace", "pandas on the host"),
    "cuml": (("cuml",), "replace", "scikit-learn on the host"),
    "cugraph": (("cugraph",), "replace", "networkx on the host"),
    "spconv": (("spconv",), "rewrite", "sparse-convolution CUDA kernels: dense nn.Conv3d, or " + REWRITE),
    "MinkowskiEngine": (("minkowskiengine",), "rewrite",
                        "sparse-convolution CUDA kernels: dense nn.Conv3d, or " + REWRITE),
    "torchsparse": (("torchsparse",), "rewrite", "sparse-convolution CUDA kernels: " + REWRITE),
    "tinycudann": ((), "rewrite", "tiny-cuda-nn: express the MLP / hash encoding in PyTorch ops"),
    "gsplat": (("gsplat",), "rewrite", "CUDA rasterizer: " + REWRITE),
    "diff_gaussian_rasterization": ((), "rewrite", "CUDA rasterizer: " + REWRITE),
    "simple_knn": ((), "rewrite", "CUDA k-NN: torch.cdist + torch.topk"),
}

# More specific advice for parts of a package (dotted prefix of what is imported).
_SPECIFIC = {
    "apex.optimizers.FusedAdam": "torch.optim.AdamW(fused=True)",
    "apex.optimizers.FusedSGD": "torch.optim.SGD",
    "apex.optimizers.FusedLAMB": "torch.optim.AdamW (torch has no LAMB: keep a PyTorch LAMB)",
    "apex.normalization.FusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization.FusedRMSNorm": "torch.nn.RMSNorm",
    "apex.amp": "torch.autocast('tpu', dtype=torch.bfloat16) (+ torch.amp.GradScaler('tpu') for float16)",
    "apex.parallel": "torch.nn.parallel.DistributedDataParallel; SyncBatchNorm -> nn.BatchNorm on one device",
    "bitsandbytes.optim": "torch.optim.AdamW (or torchao.optim.AdamW8bit)",
    "bitsandbytes.nn": "nn.Linear in bfloat16 (or torchao int8 weight-only quantization)",
    "xformers.ops": _SDPA,
    "deepspeed.ops": "torch.optim.AdamW(fused=True) / PyTorch ops (deepspeed.ops kernels are CUDA-only)",
}

# pip name (normalised) -> import name in GPU_PACKAGES
_PIP_NAMES = {pip: name for name, (pips, _, _) in GPU_PACKAGES.items() for pip in pips}
_GPU_BUILDS = {"faiss-gpu": "faiss-cpu", "onnxruntime-gpu": "onnxruntime", "paddlepaddle-gpu": "paddlepaddle"}
_CUDA_BUILD = re.compile(r"^(?P<base>.+?)-(?:cu\d+|cuda\d+x?)$")   # cudf-cu12, cupy-cuda12x

# Packages that run on CPU as they are: their guarded CUDA paths are not the
# workload's to migrate, and scanning them (transformers has thousands of files)
# would drown the report. numba.cuda and torchao's CUDA-only parts are listed
# where the workload imports them (GPU_PACKAGES).
CPU_SAFE_PACKAGES = frozenset("""
    torch torch_pjrt functorch torchvision torchaudio torchtext torchdata torchmetrics numpy scipy
    pandas sklearn matplotlib PIL cv2 skimage imageio h5py pyarrow tqdm yaml requests jinja2 rich
    click typer omegaconf hydra wandb tensorboard tensorboardX transformers tokenizers datasets
    huggingface_hub safetensors accelerate peft evaluate timm einops sentencepiece tiktoken regex
    nltk lightning pytorch_lightning pytest google absl protobuf onnx onnxruntime psutil packaging
    setuptools pkg_resources attr attrs pydantic fsspec filelock networkx sympy opt_einsum jax
    jaxlib flax optax librosa soundfile numba torchao diffusers sentence_transformers
    torch_geometric kornia seaborn plotly xgboost lightgbm
""".split())

# torch.cuda.<name> -> (effort, suggestion). Looked up by the longest dotted prefix,
# then by the last component (torch.cuda.memory.memory_allocated -> memory_allocated).
_TPU_SAME = """is_available is_initialized init device_count current_device set_device device
    synchronize get_device_name get_device_properties memory_allocated max_memory_allocated
    memory_reserved memory_stats mem_get_info reset_peak_memory_stats set_per_process_memory_fraction
    get_per_process_memory_fraction manual_seed manual_seed_all seed initial_seed get_rng_state
    set_rng_state default_generators""".split()
_DROP = "drop it: there is nothing to do on tpu"
_NO_STREAMS = "drop it: tpu work runs in order on one queue per device (XLA overlaps itself)"
_TIMING = "time with torch.tpu.synchronize() and time.perf_counter()"
_TO_COMPILE = "torch.compile(model, backend='tpu'): the whole graph runs as one XLA program"
_TORCH_CUDA = {name: ("trivial", f"torch.tpu.{name}") for name in _TPU_SAME}
_TORCH_CUDA.update({
    "": ("trivial", "torch.tpu (the tpu device module)"),
    "max_memory_reserved": ("trivial", "torch.tpu.memory_stats() / torch.tpu.memory_reserved"),
    "reset_max_memory_allocated": ("trivial", "torch.tpu.reset_peak_memory_stats"),
    "reset_accumulated_memory_stats": ("trivial", "torch.tpu.reset_peak_memory_stats"),
    "memory_summary": ("trivial", "torch.tpu.memory_stats()"),
    "memory_snapshot": ("trivial", "torch.tpu.memory_stats()"),
    "_record_memory_history": ("trivial", "drop it; torch.tpu.memory_stats() for peaks"),
    "_dump_snapshot": ("trivial", "drop it; torch.tpu.memory_stats() for peaks"),
    "empty_cache": ("trivial", _DROP + " (buffers are freed when their tensors die)"),
    "ipc_collect": ("trivial", _DROP),
    "get_device_capability": ("trivial", "drop the capability check"),
    "get_arch_list": ("trivial", "drop the architecture check"),
    "is_bf16_supported": ("trivial", "True on tpu: drop the check"),
    "set_sync_debug_mode": ("trivial", _DROP + " (TORCH_PJRT_EAGER=debug for op-by-op errors)"),
    "utilization": ("trivial", "no tpu counterpart: drop it"),
    "temperature": ("trivial", "no tpu counterpart: drop it"),
    "power_draw": ("trivial", "no tpu counterpart: drop it"),
    "OutOfMemoryError": ("trivial", "torch.OutOfMemoryError (what tpu raises)"),
    "amp": ("trivial", "torch.amp with device 'tpu'"),
    "amp.autocast": ("trivial", "torch.autocast('tpu', dtype=torch.bfloat16)"),
    "amp.custom_fwd": ("trivial", "torch.amp.custom_fwd(device_type='tpu')"),
    "amp.custom_bwd": ("trivial", "torch.amp.custom_bwd(device_type='tpu')"),
    "amp.GradScaler": ("replace",
                       "torch.amp.GradScaler('tpu') (or bfloat16 autocast, which needs no scaler)"),
    "Stream": ("trivial", _NO_STREAMS), "stream": ("trivial", _NO_STREAMS),
    "current_stream": ("trivial", _NO_STREAMS), "default_stream": ("trivial", _NO_STREAMS),
    "set_stream": ("trivial", _NO_STREAMS), "StreamContext": ("trivial", _NO_STREAMS),
    "ExternalStream": ("trivial", _NO_STREAMS),
    "Event": ("trivial", _TIMING),
    "CUDAGraph": ("replace", _TO_COMPILE), "graph": ("replace", _TO_COMPILE),
    "graphs": ("replace", _TO_COMPILE), "make_graphed_callables": ("replace", _TO_COMPILE),
    "graph_pool_handle": ("replace", _TO_COMPILE),
    "nvtx": ("trivial", "torch.profiler.record_function"),
    "comm": ("replace", "torch.distributed collectives (no tpu collective backend yet: one device)"),
    "nccl": ("replace", "torch.distributed collectives (no tpu collective backend yet: one device)"),
    "jiterator": ("rewrite", "a runtime-compiled CUDA kernel: " + REWRITE),
    "tunable": ("trivial", _DROP + " (XLA tunes its own kernels)"),
})
_TENSOR_TYPE = ("trivial", "torch.tensor(..., dtype=..., device='tpu')")   # torch.cuda.FloatTensor
_UNKNOWN_CUDA = ("replace", "no torch.tpu counterpart known: see torch.tpu's API (README) or drop it")

_ENV_VARS = {
    "CUDA_VISIBLE_DEVICES": "drop it: pick devices with torch.tpu.set_device / 'tpu:N' "
                            "(TORCH_PJRT_CPU_DEVICES on the CPU plugin)",
    "CUDA_LAUNCH_BLOCKING": "TORCH_PJRT_EAGER=debug (every op waits; errors name the op)",
    "PYTORCH_CUDA_ALLOC_CONF": "drop it (TORCH_PJRT_MEMORY_LIMIT to cap device memory)",
}
_NCCL = ("replace", "NCCL is CUDA-only; torch_pjrt has no collective backend yet: run on one "
                    "device, or 'gloo' with CPU tensors")

_DEVICE_STR = re.compile(r"^cuda(?::(?:\d+|%d|%s|%i|\{[^{}]*\}))?$")
_CUDA_DISPATCH = re.compile(r"^(?:Autograd|Sparse|SparseCsr|Quantized|Nested)?CUDA$|^cuda$")
# calls whose first argument is a device (type): the detail names the call
_DEVICE_CALLS = {"torch.device", "torch.autocast", "torch.amp.autocast", "torch.set_default_device",
                 "torch.Generator", "torch.get_device_module", "torch.amp.custom_fwd",
                 "torch.amp.custom_bwd"}
_AUTOCAST_TPU = "torch.autocast('tpu', dtype=torch.bfloat16)"
_CUDA_SWITCHES = {"cuda", "use_cuda", "on_cuda", "to_cuda", "enable_cuda"}
_LIBRARY_CALLS = {"impl", "register_kernel", "custom_op", "Library"}
_SETUP_KWARGS = {"install_requires", "extras_require", "setup_requires", "requires"}

_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules",
              "build", "dist", "site-packages", ".tox", ".nox", ".mypy_cache", ".pytest_cache",
              ".ruff_cache", ".eggs", ".ipynb_checkpoints"}
_CPP_EXT = {".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".hxx"}
_CU_EXT = {".cu", ".cuh"}


# ----------------------------------------------------------------------------- API

def scan(paths, packages=(), root=None, *, max_files=MAX_FILES, max_bytes=MAX_BYTES,
         max_items=MAX_ITEMS):
    """The "inventory" object of report.json for the workload's `paths` (files or
    directories, recursively) and the source of the importable `packages`.

    `root`: item files are relative to it (else they are the paths as walked).
    At most `max_files` files are read (the workload's own first; "truncated" says
    when the cap was hit); files over `max_bytes` are skipped. Never raises.
    """
    state = _State(root, max_files, max_bytes)
    try:
        paths = _as_list(paths)
        for path in paths:
            state.local |= _local_modules(path)
        for path in paths:
            state.scan_tree(path)
        for name in _as_list(packages):
            state.scan_package(name)
    except Exception as e:   # a bug here must not take the whole assessment down
        state.error = f"{type(e).__name__}: {e}"
    return state.result(max_items)


def imported_packages(paths, *, max_files=MAX_FILES):
    """Top-level third-party packages imported by the .py files under `paths`
    (sorted; the stdlib, relative imports and the workload's own top-level
    modules excluded). torch is included: scan() skips it. Never raises."""
    found, local, seen_dirs, seen_files, count = set(), set(), set(), set(), 0
    try:
        for path in _as_list(paths):
            local |= _local_modules(path)
            for file in _iter_files(path, seen_dirs, seen_files):
                if file.endswith(".py") and count < max_files:
                    count += 1
                    found |= _imports_of(file)
    except Exception:
        pass
    stdlib = set(getattr(sys, "stdlib_module_names", ())) | {"__future__", "__main__"}
    return sorted(found - stdlib - local)


def workload_targets(source, *, max_files=MAX_FILES):
    """scan()'s arguments for a workload named as the assess CLI names it,
    "path/to/file.py[:function]" or "package.module[:function]", without importing it:
    {"paths", "packages", "root", "error"}.

    paths: the workload's file, the workload's own modules it imports (transitively,
    resolved under root), the C++/CUDA sources those files name (cpp_extension.load,
    CUDAExtension), and root's setup.py / pyproject.toml / requirements*.txt.
    packages: imported_packages(paths). root: the directory its imports resolve from
    (above the outermost package holding the file). A workload installed in
    site-packages or the stdlib is followed within its own top-level package only."""
    try:
        target = _strip_function(os.fsdecode(source))
        file = target if target.endswith(".py") or os.path.isfile(target) else _module_file(target)
        if not file or not os.path.isfile(file):
            return {"paths": [], "packages": [], "root": None, "error": f"not found: {target}"}
        file = os.path.abspath(file)
        root = _import_root(file)
        installed = _is_installed(root)
        scope = _outermost_package(file) if installed else root
        paths = _local_closure(file, root, scope, max_files) + ([] if installed else _project_files(root))
        return {"paths": paths, "packages": imported_packages(paths), "root": root, "error": None}
    except Exception as e:
        return {"paths": [], "packages": [], "root": None, "error": f"{type(e).__name__}: {e}"}


def _strip_function(source):
    """"a/b.py:fn" -> "a/b.py"; "pkg.mod:Class.fn" -> "pkg.mod"; "C:\\x.py" unchanged."""
    head, sep, tail = source.rpartition(":")
    if sep and len(head) > 1 and all(p.isidentifier() for p in tail.split(".")):
        return head
    return source


def _module_file(dotted):
    """The .py file of a dotted module, found from its top-level package's spec
    (find_spec of the top level imports nothing; the rest is looked up on disk)."""
    parts = dotted.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except Exception:
        return None
    if spec is None:
        return None
    if len(parts) == 1:
        return spec.origin if spec.origin and spec.origin.endswith(".py") else None
    for base in spec.submodule_search_locations or ():
        path = os.path.join(base, *parts[1:])
        for candidate in (path + ".py", os.path.join(path, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def _outermost_package(file):
    """The top-level package directory holding `file` (or the file itself)."""
    top, d = file, os.path.dirname(file)
    while os.path.isfile(os.path.join(d, "__init__.py")) and os.path.dirname(d) != d:
        top, d = d, os.path.dirname(d)
    return top


def _import_root(file):
    top = _outermost_package(file)
    return os.path.dirname(top)


def _is_installed(root):
    """site-packages / dist-packages or the stdlib: other packages live beside it."""
    import sysconfig
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    real = os.path.realpath(root)
    return os.path.basename(real) in ("site-packages", "dist-packages") or real in stdlib


def _local_closure(file, root, scope, max_files):
    """`file` and every module in `scope` it imports, transitively, plus the
    C++/CUDA sources their string literals name."""
    out, seen, queue = [], set(), [file]
    scope = os.path.realpath(scope)
    while queue and len(out) < max_files:
        f = queue.pop(0)
        real = os.path.realpath(f)
        if real in seen or not (real == scope or real.startswith(scope + os.sep)):
            continue
        seen.add(real)
        out.append(f)
        if f.endswith(".py"):
            queue += _local_imports(f, root) + _package_init(f)
    return out


def _package_init(file):
    """The enclosing package's __init__.py: importing a module runs it first."""
    d = os.path.dirname(file)
    if os.path.basename(file) == "__init__.py":
        d = os.path.dirname(d)
    init = os.path.join(d, "__init__.py")
    return [init] if os.path.isfile(init) else []


def _local_imports(file, root):
    text, _ = _read(file, MAX_BYTES)
    try:
        tree = ast.parse(text or "")
    except Exception:
        return []
    here = os.path.dirname(file)
    found = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            found += [_module_path(root, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = root
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
            module = node.module or ""
            found.append(_module_path(base, module))
            found += [_module_path(base, f"{module}.{a.name}".strip(".")) for a in node.names]
    for node in ast.walk(tree):   # sources handed to cpp_extension.load / CUDAExtension
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.endswith(tuple(_CU_EXT | _CPP_EXT)) and len(node.value) < 300:
            found += [os.path.join(d, node.value) for d in (here, root)]
    return [p for p in found if p and os.path.isfile(p)]


def _module_path(base, dotted):
    if not dotted:
        return None
    path = os.path.join(base, *dotted.split("."))
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _project_files(root):
    """Build and dependency files at the top of the workload's tree."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names
            if n in ("setup.py", "pyproject.toml") or _file_kind(os.path.join(root, n)) == "requirements"]


# ----------------------------------------------------------------------------- walking

def _as_list(x):
    if isinstance(x, (str, bytes, os.PathLike)):
        return [os.fsdecode(x)]
    return [os.fsdecode(p) for p in (x or ())]


def _iter_files(path, seen_dirs, seen_files):
    """Files under `path` in a stable order; symlinked dirs are followed once
    (by real path), so link loops end."""
    if not os.path.isdir(path):
        real = os.path.realpath(path)
        if real not in seen_files:
            seen_files.add(real)
            yield path
        return
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen_dirs:
            dirnames[:] = []
            continue
        seen_dirs.add(real)
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            file = os.path.join(dirpath, name)
            real_file = os.path.realpath(file)
            if real_file not in seen_files:
                seen_files.add(real_file)
                yield file


def _file_kind(path):
    """Which scanner reads the file, or None for files that cannot hold CUDA code."""
    base = os.path.basename(path)
    ext = os.path.splitext(base)[1].lower()
    if ext == ".py":
        return "python"
    if ext in _CU_EXT:
        return "cuda"
    if ext in _CPP_EXT:
        return "cpp"
    if base == "pyproject.toml":
        return "pyproject"
    parent = os.path.basename(os.path.dirname(path))
    if ext in (".txt", ".in") and (base.startswith("requirements") or parent == "requirements"):
        return "requirements"
    return None


def _read(path, max_bytes):
    """(text, None) or (None, why it was skipped)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_size > max_bytes:
            return None, f"larger than {max_bytes} bytes ({st.st_size})"
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"
    if len(data) > max_bytes:
        return None, f"larger than {max_bytes} bytes"
    if b"\0" in data:          # also keeps ast.parse from refusing NUL bytes
        return None, "binary file"
    return data.decode("utf-8-sig", errors="replace"), None


def _local_modules(path):
    """Top-level module names the workload itself provides (so `import utils`
    beside the model is not a third-party package)."""
    names = set()
    base = path if os.path.isdir(path) else os.path.dirname(path) or "."
    if os.path.isdir(path):
        names.add(os.path.basename(os.path.normpath(path)))
    for d in (base, os.path.join(base, "src")):
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        names |= {e[:-3] for e in entries if e.endswith(".py")}
        names |= {e for e in entries if os.path.isdir(os.path.join(d, e))}
    return names


def _imports_of(file):
    text, _ = _read(file, MAX_BYTES)
    try:
        tree = ast.parse(text or "")
    except Exception:
        return set()
    names = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


# ----------------------------------------------------------------------------- state

class _State:
    """Accumulates items and bookkeeping over all files of one scan()."""

    def __init__(self, root, max_files, max_bytes):
        self.root, self.max_files, self.max_bytes = root, max_files, max_bytes
        self.items, self.skipped, self.pkg_skipped, self.pkgs = [], [], [], []
        self.files = self.walked = 0
        self.truncated = False
        self.error = None
        self.seen_dirs, self.seen_files = set(), set()
        self.local = set()      # the workload's own top-level modules: never a GPU package

    def scan_tree(self, path, label=None):
        """label(file) -> the name used in items; default: relative to root."""
        if not os.path.lexists(path):
            self.skipped.append({"file": self._name(path, label), "reason": "not found"})
            return
        for file in _iter_files(path, self.seen_dirs, self.seen_files):
            self.walked += 1
            if self.walked > MAX_WALK:
                self.truncated = True
                return
            kind = _file_kind(file)
            if kind is None:
                continue
            if self.files >= self.max_files:
                self.truncated = True
                return
            self.files += 1
            self._scan_file(file, kind, self._name(file, label))

    def scan_package(self, name):
        reason, locations = _package_locations(name)
        if reason:
            self.pkg_skipped.append({"package": name, "reason": reason})
            return
        if self.truncated:
            self.pkg_skipped.append({"package": name, "reason": f"file cap ({self.max_files}) reached"})
            return
        self.pkgs.append(name)
        self.local.add(name.split(".")[0])
        for loc in locations:
            parent = os.path.dirname(os.path.normpath(loc))
            self.scan_tree(loc, label=lambda f, p=parent: os.path.relpath(f, p))

    def _name(self, file, label):
        if label:
            name = label(file)
        elif self.root:
            try:
                name = os.path.relpath(file, self.root)
            except ValueError:   # another drive on Windows
                name = os.path.abspath(file)
        else:
            name = os.path.normpath(file)
        return name.replace(os.sep, "/")

    def _scan_file(self, file, kind, name):
        text, reason = _read(file, self.max_bytes)
        if reason:
            self.skipped.append({"file": name, "reason": reason})
            return
        try:
            found = _SCANNERS[kind](text, os.path.basename(file), self.local)
        except SyntaxError as e:
            self.skipped.append({"file": name, "reason": f"syntax error: line {e.lineno}: {e.msg}"})
            return
        except RecursionError:
            self.skipped.append({"file": name, "reason": "nested too deeply to parse"})
            return
        except Exception as e:   # ValueError (NUL bytes), MemoryError, ...
            self.skipped.append({"file": name, "reason": f"not parsed: {type(e).__name__}: {e}"})
            return
        for line, kind_, detail, effort, suggestion in found:
            self.items.append({"file": name, "line": line, "kind": kind_, "detail": detail,
                               "effort": effort, "suggestion": suggestion})

    def result(self, max_items):
        unique = {(i["file"], i["line"], i["kind"], i["detail"]): i for i in self.items}
        items = [unique[k] for k in sorted(unique)]
        summary = {e: 0 for e in EFFORTS}
        by_kind = {k: 0 for k in KINDS}
        for i in items:
            summary[i["effort"]] += 1
            by_kind[i["kind"]] += 1
        return {"files_scanned": self.files, "packages_scanned": self.pkgs,
                "items": items[:max_items], "summary": summary, "by_kind": by_kind,
                "items_total": len(items), "items_truncated": len(items) > max_items,
                "skipped": self.skipped, "packages_skipped": self.pkg_skipped,
                "truncated": self.truncated, "max_files": self.max_files, "error": self.error}


def _package_locations(name):
    """(reason to skip, None) or (None, [source dirs or files]) for an importable name."""
    top = name.split(".")[0]
    if top in getattr(sys, "stdlib_module_names", ()):
        return "standard library", None
    if top in CPU_SAFE_PACKAGES:
        return "known to run on CPU as is", None
    if top in GPU_PACKAGES or name in GPU_PACKAGES:
        return "GPU-only package: listed where it is imported", None
    try:
        spec = importlib.util.find_spec(top)
    except Exception as e:   # a broken package's parent import, a bad name
        return f"not importable: {type(e).__name__}: {e}", None
    if spec is None:
        return "not installed", None
    if spec.submodule_search_locations:
        return None, list(spec.submodule_search_locations)
    if spec.origin and spec.origin.endswith(".py"):
        return None, [spec.origin]
    return f"no Python source ({spec.origin})", None


# ----------------------------------------------------------------------------- Python

# Every Python item needs one of these words in the file, or an import of a GPU
# package: files with neither (most of a large tree) are not parsed at all.
_TRIGGERS = ("cuda", "cudnn", "nccl", "triton", "sdpa_kernel", "cpp_extension", "load_library")
_IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)|import[ \t]+([\w. \t,]+))", re.M)
_GPU_TOPS = {name.split(".")[0] for name in GPU_PACKAGES}


def _may_have_items(text, basename):
    if basename == "setup.py":          # install_requires strings name pip packages
        return True
    low = text.lower()
    if any(t in low for t in _TRIGGERS):
        return True
    for m in _IMPORT_LINE.finditer(text):
        mods = [m.group(1)] if m.group(1) else [p.split()[0] for p in m.group(2).split(",") if p.strip()]
        if any(mod.split(".")[0] in _GPU_TOPS for mod in mods):
            return True
    return False


def _scan_python(text, basename, local):
    if not _may_have_items(text, basename):
        return []
    tree = ast.parse(text)
    visitor = _PyVisitor(_aliases(tree), local, is_setup=basename == "setup.py")
    visitor.visit(tree)
    return visitor.found


def _statements(body):
    """Every statement, nested ones included, without walking expressions (imports
    are statements; this is several times cheaper than ast.walk)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def _aliases(tree):
    """Local name -> the dotted name it stands for, from every import in the file."""
    aliases = {}
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _cuda_api(rest):
    """(effort, suggestion) for torch.cuda.<rest>."""
    parts = rest.split(".") if rest else []
    for n in range(len(parts), 0, -1):
        hit = _TORCH_CUDA.get(".".join(parts[:n]))
        if hit:
            return hit
    if parts and parts[-1] in _TORCH_CUDA:
        return _TORCH_CUDA[parts[-1]]
    if parts and parts[-1].endswith("Tensor"):
        return _TENSOR_TYPE
    return _TORCH_CUDA[""] if not parts else _UNKNOWN_CUDA


def _package_of(module):
    """The GPU_PACKAGES key for a dotted module name, most specific first."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in GPU_PACKAGES:
            return key
    return None


def _gpu_import(dotted):
    """(effort, suggestion) if importing `dotted` pulls in a GPU-only package."""
    key = _package_of(dotted)
    if key is None:
        return None
    _, effort, suggestion = GPU_PACKAGES[key]
    for prefix, specific in _SPECIFIC.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            suggestion = specific
    return effort, suggestion


def _is_import_error_guard(handlers):
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for h in handlers:
        t = h.type
        if t is None:
            return True
        elts = t.elts if isinstance(t, ast.Tuple) else [t]
        if any(isinstance(e, ast.Name) and e.id in names for e in elts):
            return True
    return False


class _PyVisitor(ast.NodeVisitor):
    """Collects (line, kind, detail, effort, suggestion) tuples from one module."""

    def __init__(self, aliases, local, is_setup):
        self.aliases, self.local, self.is_setup = aliases, local, is_setup
        self.found = []
        self.consumed = set()   # ids of string nodes already reported inside a larger item
        self.guarded = 0        # depth of try/except ImportError blocks

    def add(self, node, kind, detail, effort, suggestion):
        self.found.append((node.lineno, kind, detail, effort, suggestion))

    def qual(self, node):
        """Dotted name of a Name/Attribute chain with import aliases resolved."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    # -- imports

    def visit_Try(self, node):
        guard = _is_import_error_guard(node.handlers)
        self.guarded += guard
        for stmt in node.body:
            self.visit(stmt)
        self.guarded -= guard
        for part in node.handlers + node.orelse + node.finalbody:
            self.visit(part)

    visit_TryStar = visit_Try

    def visit_Import(self, node):
        for a in node.names:
            self.import_item(node, a.name)

    def visit_ImportFrom(self, node):
        if node.level or not node.module:
            return
        for a in node.names:
            self.import_item(node, node.module if a.name == "*" else f"{node.module}.{a.name}")

    def import_item(self, node, dotted):
        if dotted.split(".")[0] in self.local:
            return          # e.g. causal_conv1d's own `from causal_conv1d.ops import ...`
        if dotted == "triton" or dotted.startswith("triton."):
            self.add(node, "triton_kernel", f"import {dotted}", "rewrite",
                     "Triton kernels run on GPUs only: " + REWRITE)
            return
        hit = _gpu_import(dotted)
        if hit:
            effort, suggestion = hit
            if self.guarded:
                suggestion += " (optional import: check that the fallback path is taken)"
            self.add(node, "gpu_package", dotted, effort, suggestion)

    # -- definitions

    def visit_FunctionDef(self, node):
        """One item per kernel, at its first kernel decorator."""
        decorators = [(d, self.qual(d.func if isinstance(d, ast.Call) else d) or "")
                      for d in node.decorator_list]
        triton = [(d, q) for d, q in decorators if q.startswith("triton.")]
        numba = [(d, q) for d, q in decorators if q.startswith("numba.cuda.")]
        for found, kind in ((triton, "triton_kernel"), (numba, "cuda_source")):
            if found:
                names = " ".join("@" + q for _, q in found)
                self.found.append((found[0][0].lineno, kind, f"{names} kernel {node.name}",
                                   "rewrite", REWRITE))
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    # -- names and attributes

    def visit_Attribute(self, node):
        q = self.qual(node)
        if q and self.report_qual(node, q):
            return          # the whole chain is one item
        if node.attr == "is_cuda":
            self.add(node, "cuda_call", ".is_cuda", "trivial", "x.device.type == 'tpu'")
        self.generic_visit(node)

    def visit_Name(self, node):
        q = self.aliases.get(node.id)
        if q:
            self.report_qual(node, q)

    def report_qual(self, node, q):
        parts = q.split(".")
        if parts[:2] == ["torch", "cuda"]:
            effort, suggestion = _cuda_api(".".join(parts[2:]))
            self.add(node, "cuda_api", q, effort, suggestion)
            return True
        if parts[:3] in (["torch", "backends", "cudnn"], ["torch", "backends", "cuda"]) \
                or q == "torch.nn.attention.sdpa_kernel":
            self.add(node, "cudnn_flag", q, "trivial", _cudnn_suggestion(q))
            return True
        return False

    # -- strings

    def visit_Constant(self, node):
        if not isinstance(node.value, str) or id(node) in self.consumed:
            return
        v = node.value
        if _DEVICE_STR.match(v):
            self.add(node, "device_string", f'"{v}"', "trivial", _tpu_string(v))
        elif v == "nccl":
            self.add(node, "cuda_api", '"nccl"', *_NCCL)
        elif v in _ENV_VARS or v.startswith("NCCL_") and v[5:].isupper():
            self.add(node, "cuda_api", v, "trivial", _ENV_VARS.get(v, "drop it (NCCL setting)"))

    def visit_JoinedStr(self, node):
        if id(node) not in self.consumed and _fstring_device(node):
            self.add(node, "device_string", _fstring_text(node), "trivial", "f\"tpu:{...}\"")
            return
        self.generic_visit(node)

    # -- calls

    def visit_Call(self, node):
        func = node.func
        q = self.qual(func) or ""
        attr = func.attr if isinstance(func, ast.Attribute) else q.rsplit(".", 1)[-1]
        if isinstance(func, ast.Attribute) and attr == "cuda" and not q.startswith("torch."):
            self.add(node, "cuda_call", ".cuda()", "trivial", ".to('tpu') (or .to(device))")
        elif isinstance(func, ast.Attribute) and attr == "to":
            self.check_to(node)
        elif q in _DEVICE_CALLS:
            self.check_device_call(node, q)
        elif q in ("torch.amp.GradScaler", "torch.GradScaler"):
            self.check_grad_scaler(node, q)
        elif q in ("torch.ops.load_library", "torch.classes.load_library"):
            self.add(node, "custom_op", q, "rewrite",
                     "a compiled op library (CUDA kernels): " + REWRITE)
        elif q.startswith("torch.utils.cpp_extension."):
            self.check_cpp_extension(node, q)
        elif attr in _LIBRARY_CALLS:
            self.check_library(node, q or attr)
        elif self.is_setup and attr == "setup":
            self.check_setup(node)
        self.check_keywords(node)
        self.generic_visit(node)

    def check_to(self, node):
        for arg in list(node.args[:1]) + [k.value for k in node.keywords if k.arg == "device"]:
            if self.is_cuda_device(arg):
                self.add(node, "cuda_call", f".to({_short(arg)})", "trivial", ".to('tpu') (or .to(device))")
                return

    def check_device_call(self, node, q):
        if id(node) in self.consumed:
            return
        args = list(node.args[:1]) + [k.value for k in node.keywords
                                      if k.arg in ("device", "device_type", "type")]
        for arg in args:
            if self.is_cuda_device(arg):
                suggestion = _AUTOCAST_TPU if "autocast" in q else f"{q}('tpu')"
                self.add(node, "device_string", f"{q}({_short(arg)})", "trivial", suggestion)
                return

    def check_grad_scaler(self, node, q):
        args = list(node.args[:1]) + [k.value for k in node.keywords if k.arg == "device"]
        if args and not any(self.is_cuda_device(a) for a in args):
            return            # a GradScaler for another device
        detail = f"{q}({_short(args[0])})" if args else f"{q}() (defaults to cuda)"
        self.add(node, "cuda_api", detail, *_TORCH_CUDA["amp.GradScaler"])

    def check_cpp_extension(self, node, q):
        name = q.rsplit(".", 1)[-1]
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        cuda = (name == "CUDAExtension"
                or name == "load" and (_mentions_cu(node) or _is_true(kw.get("with_cuda")))
                or name == "load_inline" and ("cuda_sources" in kw and not _is_none(kw["cuda_sources"])
                                              or len(node.args) > 2 or _is_true(kw.get("with_cuda"))))
        if cuda:
            self.add(node, "cpp_extension", q, "rewrite", "a CUDA extension: " + REWRITE)

    def check_library(self, node, q):
        strings = [n for a in list(node.args) + [k.value for k in node.keywords] for n in ast.walk(a)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        keys = [s for s in strings if _CUDA_DISPATCH.match(s.value)]
        if not keys:
            return
        self.consumed |= {id(s) for s in keys}
        self.add(node, "custom_op", f'{q}(..., "{keys[0].value}")', "rewrite",
                 "a CUDA implementation of a custom op: " + REWRITE)

    def check_setup(self, node):
        for k in node.keywords:
            if k.arg in _SETUP_KWARGS:
                for n in ast.walk(k.value):
                    if isinstance(n, ast.Constant) and isinstance(n.value, str):
                        hit = _requirement(n.value)
                        if hit:
                            self.found.append((n.lineno, "gpu_package") + hit)

    def check_keywords(self, node):
        for k in node.keywords:
            if k.arg in _CUDA_SWITCHES and _is_true(k.value):
                self.add(k.value, "cuda_call", f"{k.arg}=True", "trivial",
                         "pass the device ('tpu') instead of a CUDA switch")
            elif k.arg and id(k.value) not in self.consumed and self.is_cuda_device(k.value):
                self.add(k.value, "device_string", f"{k.arg}={_short(k.value)}", "trivial",
                         f"{k.arg}={_tpu_for(k.value)}")

    def is_cuda_device(self, node):
        """Whether `node` is a CUDA device expression; marks its strings consumed."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _DEVICE_STR.match(node.value):
            self.consumed.add(id(node))
            return True
        if isinstance(node, ast.JoinedStr) and _fstring_device(node):
            self.consumed.add(id(node))
            return True
        if isinstance(node, ast.Call) and self.qual(node.func) == "torch.device" and node.args:
            if self.is_cuda_device(node.args[0]):
                self.consumed.add(id(node))     # not reported again as torch.device(...)
                return True
        return False


def _cudnn_suggestion(q):
    if "tf32" in q or "matmul" in q:
        return "drop it (for faster float32 matmuls: torch.set_float32_matmul_precision('high'))"
    if "sdp" in q:
        return "drop it: scaled_dot_product_attention picks its own lowering on tpu"
    return "drop it: XLA picks its own kernels"


def _tpu_string(v):
    return '"' + v.replace("cuda", "tpu", 1) + '"'


def _tpu_for(node):
    """The tpu spelling of a CUDA device expression."""
    if isinstance(node, ast.Constant):
        return _tpu_string(node.value)
    if isinstance(node, ast.JoinedStr):
        return 'f"tpu:{...}"'
    return 'torch.device("tpu")'


def _short(node, limit=60):
    """Source text of a node for a detail line, with double quotes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return f'"{node.value}"'
    if isinstance(node, ast.JoinedStr):
        return _fstring_text(node)
    try:
        text = ast.unparse(node).replace("'", '"')
    except Exception:
        return "..."
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _fstring_device(node):
    """f"cuda:{rank}" and f"cuda" (a first literal part naming cuda)."""
    if not node.values or not isinstance(node.values[0], ast.Constant):
        return False
    head = str(node.values[0].value)
    return head == "cuda:" and len(node.values) > 1 or bool(_DEVICE_STR.match(head)) and len(node.values) == 1


def _fstring_text(node):
    parts = []
    for v in node.values:
        parts.append(str(v.value) if isinstance(v, ast.Constant) else "{...}")
    return 'f"' + "".join(parts) + '"'


def _is_true(node):
    return isinstance(node, ast.Constant) and node.value is True


def _is_none(node):
    return isinstance(node, ast.Constant) and node.value is None


def _mentions_cu(node):
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
               and n.value.endswith((".cu", ".cuh")) for n in ast.walk(node))


# ----------------------------------------------------------------------------- requirements

def _normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(spec):
    """(detail, effort, suggestion) for one requirement string naming a GPU-only
    package or a CUDA build, else None."""
    spec = spec.split(" #", 1)[0].strip()
    egg = re.search(r"#egg=([A-Za-z0-9._-]+)", spec)
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", egg.group(1) if egg else spec)
    if not m or spec.startswith("-") and not egg:
        return None
    name = _normalise(m.group(0))
    if name in ("torch", "torchvision", "torchaudio") and re.search(r"\+cu\d+", spec):
        return (spec, "trivial", "the CPU wheel (torch_pjrt runs on CPU torch: torch==2.13.0)")
    key = _PIP_NAMES.get(name)
    if key:
        return (spec, GPU_PACKAGES[key][1], GPU_PACKAGES[key][2])
    if name.startswith("nvidia-dali"):
        return (spec,) + GPU_PACKAGES["nvidia.dali"][1:]
    if name.startswith("nvidia-"):
        return (spec, "replace", _DROP_CUDA_WHEEL)
    for gpu_build, cpu_build in _GPU_BUILDS.items():
        if name == gpu_build or name.startswith(gpu_build + "-"):
            return (spec, "replace", f"its CPU build: {cpu_build}")
    build = _CUDA_BUILD.match(name)
    if build:
        base = build.group("base")
        if base in _PIP_NAMES:
            return (spec, GPU_PACKAGES[_PIP_NAMES[base]][1], GPU_PACKAGES[_PIP_NAMES[base]][2])
        return (spec, "replace", f"a CUDA build of {base}: its CPU build or a PyTorch replacement")
    return None


def _scan_requirements(text, _basename, _local=()):
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") and re.search(r"/whl/cu\d+", line):
            found.append((lineno, "gpu_package", line, "trivial",
                          "the CPU wheel index (torch_pjrt runs on CPU torch)"))
            continue
        hit = _requirement(line)
        if hit:
            found.append((lineno, "gpu_package") + hit)
    return found


_TOML_HEADER = re.compile(r"^\[\[?([^\]]+)\]\]?$")
_TOML_KEY = re.compile(r"""^["']?([\w.-]+)["']?\s*=\s*(.*)$""")
_QUOTED = re.compile(r"\"([^\"]*)\"|'([^']*)'")


def _quoted(text):
    return [a or b for a, b in _QUOTED.findall(text)]


def _scan_pyproject(text, _basename, _local=()):
    """Dependency strings of pyproject.toml, line by line (tomllib gives no line
    numbers): `dependencies`/`requires` arrays (PEP 621, build-system, uv) and
    the keys of dependency tables (poetry, optional-dependencies groups)."""
    found, table, in_array = [], "", False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        header = _TOML_HEADER.match(line)
        if header:
            table, in_array = header.group(1).strip(), False
            continue
        if "CUDAExtension" in line:
            found.append((lineno, "cpp_extension", "CUDAExtension", "rewrite",
                          "a CUDA extension: " + REWRITE))
        dep_table = table.endswith("dependencies") or table == "dependency-groups"
        strings = []
        if in_array:
            strings = _quoted(line)
            in_array = "]" not in line
        elif _TOML_KEY.match(line):
            key, value = _TOML_KEY.match(line).groups()
            dep_key = key.endswith("dependencies") or key == "requires"
            if dep_table:
                strings = [key]                      # poetry: flash-attn = "^2.5"
            if dep_table and value.startswith("[") or dep_key:
                strings += _quoted(value)            # optional-dependencies: gpu = ["xformers"]
                in_array = value.startswith("[") and "]" not in value
        for s in strings:
            hit = _requirement(s)
            if hit:
                found.append((lineno, "gpu_package") + hit)
    return found


# ----------------------------------------------------------------------------- C++ / CUDA

# All patterns here match in linear time, also on hostile input: an unterminated
# /* comment runs to the end (\Z) instead of being retried at every later "/*".
_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
_GLOBAL = re.compile(r"\b__global__\b")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_LAUNCH = re.compile(r"<<<")
_LIB_IMPL = re.compile(r"TORCH_LIBRARY_IMPL\s*\(\s*(\w+)\s*,\s*(\w*CUDA\w*)\s*,")
_CUDA_INCLUDE = re.compile(
    r'#\s*include\s*[<"]((?:cuda|cublas|cudnn|cufft|curand|cusparse|cusolver|nccl|nvrtc|thrust/|cub/'
    r'|cutlass/|ATen/cuda/|c10/cuda/)[^>"]*)[>"]')


def _blank(match):
    """A comment replaced by its newlines only, so line numbers stay right."""
    return "\n" * match.group(0).count("\n")


def _kernels(code):
    """(position, name) of each __global__ function: the last identifier before
    its "(" (template and return type come first)."""
    for m in _GLOBAL.finditer(code):
        paren = code.find("(", m.end(), m.end() + 400)
        names = _IDENT.findall(code, m.end(), paren) if paren > 0 else []
        if names:
            yield m.start(), names[-1]


def _scan_cpp(text, basename, _local=()):
    code = _CPP_COMMENT.sub(_blank, text)
    code = _LAUNCH_BOUNDS.sub(lambda m: " " * len(m.group(0).replace("\n", "")) + _blank(m), code)
    newlines = [m.start() for m in re.finditer("\n", code)]

    def line_of(pos):
        return bisect.bisect_left(newlines, pos) + 1

    found = [(line_of(m.start()), "custom_op", f"TORCH_LIBRARY_IMPL({m.group(1)}, {m.group(2)}, ...)",
              "rewrite", "a CUDA implementation of a custom op: " + REWRITE)
             for m in _LIB_IMPL.finditer(code)]
    kernels = [(line_of(pos), "cuda_source", f"__global__ kernel {name}", "rewrite", REWRITE)
               for pos, name in _kernels(code)]
    found += kernels
    if kernels:
        return found
    launch = _LAUNCH.search(code)
    include = _CUDA_INCLUDE.search(code)
    if launch:
        found.append((line_of(launch.start()), "cuda_source", "CUDA kernel launch <<<...>>>",
                      "rewrite", REWRITE))
    elif include:
        found.append((line_of(include.start()), "cuda_source", f"#include <{include.group(1)}>", "rewrite",
                      "C++ on the CUDA runtime/libraries: " + REWRITE))
    elif os.path.splitext(basename)[1].lower() in _CU_EXT:
        found.append((1, "cuda_source", f"CUDA source {basename}", "rewrite", REWRITE))
    return found


_SCANNERS = {"python": _scan_python, "cuda": _scan_cpp, "cpp": _scan_cpp,
             "requirements": _scan_requirements, "pyproject": _scan_pyproject}
