#!/usr/bin/env bash
# Static checks over src/ (configuration in pyproject.toml): ruff (pycodestyle, pyflakes, bugbear, a McCabe
# complexity limit of 20, import order, pyupgrade, simplify, blind excepts, unused noqa) and ruff's
# formatter, mypy (check_untyped_defs, no implicit Optional, stale ignores are errors, pydantic plugin), and
# the published JSON Schemas against their models. Exits non-zero on any finding.
# scripts/test.sh (the README's test command, run by .ci/run) runs it before the tests; ~20 s cold.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff check src"
.venv/bin/ruff check --no-cache src
echo "lint: ruff format --check src"
.venv/bin/ruff format --check --no-cache src
echo "lint: mypy (src/servelab)"
.venv/bin/mypy --cache-dir "${TMPDIR:-/tmp}/servelab-mypy-cache"
echo "lint: servelab schema check"
.venv/bin/servelab schema check
