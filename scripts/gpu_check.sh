#!/usr/bin/env bash
# GPU check (run on a machine with an NVIDIA GPU and jax_plugins/xla_cuda13):
# builds against the machine's own torch and runs the suite on the CUDA plugin.
# Usage: bash scripts/gpu_check.sh [pytest args]   (output goes to stdout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
"$PY" -c "import torch, jax_plugins.xla_cuda13" # the GPU machine's torch and CUDA plugin
if [ ! -f third_party/include/xla/pjrt/c/pjrt_c_api.h ]; then
  echo "copy third_party/include (the PJRT header) along: the GPU machine has no network" >&2
  exit 1
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
cmake --build build-gpu -- -j"$(nproc)" | grep -v "^\[" || true
export TORCH_PJRT_BUILD_DIR="$ROOT/build-gpu" TORCH_PJRT_PLUGIN=cuda PYTHONPATH="$ROOT" TF_CPP_MIN_LOG_LEVEL=2
"$PY" -c "import torch, torch_pjrt; print(torch_pjrt.plugin_info()); print(torch.tpu.device_count(), torch.tpu.get_device_name())"
"$PY" examples/demo.py
"$PY" -m pytest tests/test_training.py tests/test_autograd.py tests/test_compile.py -q -p no:cacheprovider
# Reliability on the CUDA plugin: its own memory figures (PJRT_Device_MemoryStats), OOM, threads, checks.
"$PY" -c "import torch, torch_pjrt; print(torch.tpu.memory_stats(), torch.tpu.mem_get_info(), torch.tpu.get_device_properties(0))"
"$PY" -m pytest tests/test_memory.py tests/test_threads.py tests/test_device_checks.py tests/test_fork.py -q -p no:cacheprovider
"$PY" benchmarks/checks_cost.py --markdown
# Eager training throughput, tpu (CUDA plugin) against PyTorch eager on CUDA.
"$PY" benchmarks/eager_training.py --steps 40 --markdown --baseline cuda
# torch.compile(backend="tpu") on the CUDA plugin against torch.compile (inductor) on CUDA,
# same models, dtype (float32) and batch; cold, warm-cache and steady-state times.
"$PY" benchmarks/compile_bench.py --configs tpu-compiled,tpu-eager,cuda-eager,cuda-inductor --steps 30
# Issue 14 item 7: fused eager (training steps, greedy generation, per-op launch) on the
# CUDA plugin against PyTorch eager on CUDA, in one process, modes alternating.
"$PY" benchmarks/fused_eager.py --baseline cuda --skip-growth --repeats 2 --markdown
# Issue 15 item 6: the captured training step against torch.compile (inductor) on CUDA
# and JAX's jitted step on CUDA, float32, same batch ...
JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" benchmarks/compile_bench.py --modes train \
  --configs tpu-compiled,tpu-captured,cuda-eager,cuda-inductor,jax --steps 30
# ... and head to head with JAX in one process; here JAX's program runs on the same CUDA
# plugin under both runtimes, so "plugin vs jax's client" is the runtimes alone.
JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" benchmarks/capture_vs_jax.py --blocks 5 --markdown
# On-device collectives through the CUDA plugin: a one-rank group runs its
# collectives as programs (programs over 2 devices need 2 GPUs).
TORCH_PJRT_DEVICE_COLLECTIVES=1 "$PY" -m pytest tests/test_device_collectives.py -q -p no:cacheprovider
"$PY" -m pytest tests -q -p no:cacheprovider "$@"
