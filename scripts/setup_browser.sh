#!/usr/bin/env bash
# Headless Chromium + Playwright for the dashboard's browser tests (tests/dashboard/).
#
# Uses Debian's Chromium (/usr/bin/chromium) and the Python playwright package only as a driver:
# never run `playwright install`, which downloads its own browsers. Needs root for apt-get.
#   usage: scripts/setup_browser.sh [path/to/venv]   (default: .venv)
set -euo pipefail

VENV="${1:-.venv}"

if ! command -v chromium >/dev/null 2>&1; then
    apt-get update
    apt-get install -y chromium
fi
"$VENV/bin/pip" install playwright

chromium --version 2>/dev/null  # (Debian's wrapper script may print a harmless "[: unexpected operator")
"$VENV/bin/python" -c "import playwright; print('playwright', __import__('importlib.metadata').metadata.version('playwright'))"
