#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: Python env, pinned packages, the PJRT
# C API header, and the C++ build. Every other script sources this one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
BUILD="${TORCH_PJRT_BUILD_DIR:-$ROOT/build}"
HEADER="$ROOT/third_party/include/xla/pjrt/c/pjrt_c_api.h"

log() { echo "[setup] $*" >&2; }

if [ ! -x "$PY" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha"
want="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing pinned Python packages"
  "$PY" -m pip install -q -r "$ROOT/requirements.txt" 2>&1 | grep -v "is ignored: it is neither" || true
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -c "import torch, xla_plugins" >/dev/null
  echo "$want" > "$stamp"
fi

if [ ! -f "$HEADER" ]; then
  log "fetching pjrt_c_api.h from the tensorflow-cpu wheel (header only, nothing installed)"
  "$PY" "$ROOT/scripts/fetch_pjrt_header.py" "$ROOT/third_party/include" >/dev/null
fi

if ! command -v ccache >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  log "installing ccache (Debian)"
  (apt-get update -qq && apt-get install -y -qq ccache) >/dev/null 2>&1 || log "ccache unavailable; building without it"
fi

if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  log "installing chromium (Debian; headless browser for the assessment report's page test)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || log "chromium unavailable; tests/test_assess_report.py skips its browser check"
fi

export CCACHE_BASEDIR="$ROOT"  # cache hits across clones of the repo
log "building the C++ extension in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$PY" >/dev/null
cmake --build "$BUILD" -- -j"${TORCH_PJRT_JOBS:-$(nproc)}" | grep -v "^\[" || true
test -f "$BUILD"/torch_pjrt_C*.so || { echo "[setup] build failed" >&2; exit 1; }
