#!/usr/bin/env bash
# The browser the viewer tests drive: Debian's chromium (playwright cannot download
# browsers on machines without general internet access; the Python package comes
# with the dev extra). Best effort: without it the browser tests skip and say so.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser.sh: no chromium and no root apt-get here; the browser tests will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null \
  || echo "install_browser.sh: apt-get install chromium failed; the browser tests will skip" >&2
exit 0
