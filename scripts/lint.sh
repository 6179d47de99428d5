#!/usr/bin/env bash
# Static checks (configuration in pyproject.toml): ruff over src/, tests/ and benches/ (pycodestyle, pyflakes,
# bugbear, a McCabe complexity limit of 20, import order, pyupgrade, simplify, blind excepts, unused noqa) and
# ruff's formatter over the same three, mypy over src/servelab (check_untyped_defs, no implicit Optional, stale
# ignores are errors, pydantic plugin), and the published JSON Schemas against their models. Exits non-zero on
# any finding.
# scripts/test.sh (the README's test command, run by .ci/run) runs it before the tests; ~20 s cold.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff check src tests benches"
.venv/bin/ruff check --no-cache src tests benches
echo "lint: ruff format --check src tests benches"
.venv/bin/ruff format --check --no-cache src tests benches
echo "lint: mypy (src/servelab)"
.venv/bin/mypy --cache-dir "${TMPDIR:-/tmp}/servelab-mypy-cache"
echo "lint: servelab schema check"
.venv/bin/servelab schema check
