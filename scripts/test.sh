#!/usr/bin/env bash
# The test command: set-up (idempotent), then the whole pytest suite, then
# the core test files again with fused eager on (TORCH_PJRT_EAGER=fused: the
# same tests, ops recorded and run as traces). Arguments go to the first
# pytest run only and skip the fused one (e.g. `bash scripts/test.sh -x`).
# Test files are spread over worker processes (pytest-xdist, whole files per
# worker): TORCH_PJRT_TEST_WORKERS, default the CPU count up to 4; 1: none.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
PY="$ROOT/.venv/bin/python"
cores="$(nproc)"
WORKERS="${TORCH_PJRT_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
PAR=()
[ "$WORKERS" -le 1 ] || PAR=(-n "$WORKERS" --dist loadfile)
"$PY" -m pytest tests -q -p no:cacheprovider "${PAR[@]}" "$@"
[ "$#" -eq 0 ] || exit 0
# Core files: views, autograd, ops, training, random, memory, threads, generation.
FUSED_FILES=(
  tests/test_views.py tests/test_autograd.py tests/test_elementwise.py tests/test_training.py
  tests/test_random.py tests/test_shape_ops.py tests/test_index_scatter.py tests/test_reductions.py
  tests/test_matmul.py tests/test_norm_embedding.py tests/test_losses.py tests/test_activations.py
  tests/test_autocast.py tests/test_conv_pool.py tests/test_creation.py tests/test_device.py
  tests/test_offset_programs.py tests/test_generate.py tests/test_threads.py tests/test_eager_modes.py
  tests/test_memory.py tests/test_attention.py tests/test_sort_scan.py tests/test_upsample_pad.py
  tests/test_pointwise_ternary.py tests/test_fallback.py tests/test_device_checks.py tests/test_fused_eager.py
  tests/test_capture_step.py tests/test_math_more.py tests/test_lu.py tests/test_embedding_bag.py tests/test_foreach.py
  tests/test_nested.py tests/test_float8.py tests/test_functorch.py
)
echo "== the core test files again, fused eager (TORCH_PJRT_EAGER=fused) =="
TORCH_PJRT_EAGER=fused "$PY" -m pytest "${FUSED_FILES[@]}" -q -p no:cacheprovider "${PAR[@]}"
