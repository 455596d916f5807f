#!/usr/bin/env bash
# The main job: set-up (idempotent), then a migration assessment of the shipped
# GPT (training, eager and compiled) and of a tiny Hugging Face Llama built from
# a config (generation), each a report in reports/<name>/report.html.
# (The training walkthrough of earlier versions: .venv/bin/python examples/demo.py.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
PY="$ROOT/.venv/bin/python"
OUT="${TORCH_PJRT_REPORTS:-$ROOT/reports}"
"$PY" -m torch_pjrt assess examples/workloads.py:gpt --out "$OUT/gpt" --config examples/assess.toml "$@"
if "$PY" -c "import transformers" 2>/dev/null; then
  "$PY" -c "import sys; from torch_pjrt.assess.hf import make_tiny_llama; make_tiny_llama(sys.argv[1])" \
    "$OUT/tiny-llama-model"
  "$PY" -m torch_pjrt assess --hf "$OUT/tiny-llama-model" --out "$OUT/tiny-llama" --quick "$@"
fi
echo "reports: $OUT/gpt/report.html, $OUT/tiny-llama/report.html (open them in a browser)"
