#!/usr/bin/env bash
# Install Debian's headless-capable Chromium, used by tests/trial/test_report.py to check that the
# trial report renders its charts. Idempotent: exits 0 at once when `chromium` is already on PATH.
# Needs root (or passwordless sudo) for apt-get; runs `apt-get update` only when the package is unknown.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-chromium: need root (or sudo) to run apt-get install chromium" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show chromium >/dev/null 2>&1; then
    $SUDO apt-get update
fi
$SUDO apt-get install -y chromium
command -v chromium >/dev/null 2>&1 || { echo "install-chromium: chromium not on PATH after install" >&2; exit 1; }
echo "chromium installed: $(command -v chromium)"
