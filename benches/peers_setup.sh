#!/usr/bin/env bash
# Install the peer load generators (guidellm, AIPerf) into their own venvs so that
# benches/generator_capacity.py can measure them against the same mock engine.
#
#   ${SERVELAB_CACHE:-~/.cache/servelab}/peers/guidellm   guidellm 0.8.1 (+ local CPU torch)
#   ${SERVELAB_CACHE:-~/.cache/servelab}/peers/aiperf     aiperf 0.13.0
#
# Never touches the project venv. Idempotent: an existing working install is kept.
# Usage: benches/peers_setup.sh [guidellm|aiperf|all]   (default all; the two run in parallel)
set -euo pipefail

CACHE="${SERVELAB_CACHE:-$HOME/.cache/servelab}"
PEERS="$CACHE/peers"
PY="${PYTHON:-python3}"
GUIDELLM_VERSION="${GUIDELLM_VERSION:-0.8.1}"
AIPERF_VERSION="${AIPERF_VERSION:-0.13.0}"
mkdir -p "$PEERS"

install_guidellm() {
  local v="$PEERS/guidellm"
  if [ -x "$v/bin/guidellm" ] && "$v/bin/python" -c 'import guidellm' 2>/dev/null; then
    echo "[guidellm] already installed in $v"; return 0
  fi
  local t0=$SECONDS
  "$PY" -m venv "$v"
  # torch first (the local +cpu wheel), otherwise pip pulls a ~6 GB CUDA build.
  "$v/bin/pip" install -q "torch==2.13.0+cpu" "guidellm==$GUIDELLM_VERSION"
  echo "[guidellm] installed in $v in $((SECONDS - t0)) s"
}

install_aiperf() {
  local v="$PEERS/aiperf"
  if [ -x "$v/bin/aiperf" ] && "$v/bin/python" -c 'import aiperf' 2>/dev/null; then
    echo "[aiperf] already installed in $v"; return 0
  fi
  local t0=$SECONDS
  "$PY" -m venv "$v"
  "$v/bin/pip" install -q "aiperf==$AIPERF_VERSION"
  echo "[aiperf] installed in $v in $((SECONDS - t0)) s"
}

what="${1:-all}"
case "$what" in
  guidellm) install_guidellm ;;
  aiperf) install_aiperf ;;
  all)
    install_guidellm > "$PEERS/guidellm-install.log" 2>&1 &
    g=$!
    install_aiperf > "$PEERS/aiperf-install.log" 2>&1 &
    a=$!
    rc=0
    wait "$g" || { echo "guidellm install failed, see $PEERS/guidellm-install.log"; rc=1; }
    wait "$a" || { echo "aiperf install failed, see $PEERS/aiperf-install.log"; rc=1; }
    cat "$PEERS/guidellm-install.log" "$PEERS/aiperf-install.log" | grep -E '^\[' || true
    exit $rc
    ;;
  *) echo "usage: $0 [guidellm|aiperf|all]" >&2; exit 2 ;;
esac
