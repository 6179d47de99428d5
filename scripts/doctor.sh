#!/usr/bin/env bash
# `servelab doctor` that also runs before scripts/setup.sh: with the venv's Python when it exists, else the
# system python3 with src/ on the path (servelab.doctor imports only the standard library at load time).
# Arguments go to it: --for tests, --no-run. Exit 1 when the trial (or, --for tests, the suite) cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then exec .venv/bin/python -m servelab.doctor "$@"; fi
PYTHONPATH=src exec "${PYTHON:-python3}" -m servelab.doctor "$@"
