#!/usr/bin/env bash
# Install Debian's Chromium and its chromedriver if missing; idempotent, silent when present.
# The dashboard page test (tests/interop/test_dashboard.py) drives it headless through
# Selenium; nothing is downloaded at test time (Selenium is told both binaries' paths).
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
echo "installing chromium and chromium-driver (the dashboard page tests)..." >&2
$SUDO apt-get update -y -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  chromium chromium-driver >/dev/null
chromium --version 2>/dev/null
