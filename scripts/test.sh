#!/usr/bin/env bash
# The test suite: unit tests, recorded-stream tests of every ENGINE_WIRE.md case, timing tests against
# servelab's mock engine, and integration tests against the real llama-server with real Gemma weights.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SERVELAB_REQUIRE_ENGINE=1   # a missing llama-server must fail the engine tests, not skip them
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
