#!/usr/bin/env bash
# `make test` needs a redis-server binary: the limits-store tests start their
# own instances (loopback, no persistence) and stop them by PID. This installs
# the Debian package when the binary is missing and we are root (CI), without
# starting the system service; otherwise it says what to install.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "redis-server is missing: the limits-store tests need it." >&2
  echo "Install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis)." >&2
  exit 1
fi
echo "installing redis-server (the tests start their own instances; no service is started)"
bash "$(dirname "$0")/apt-install-no-service.sh" redis-server
command -v redis-server >/dev/null 2>&1 || { echo "redis-server still missing after install" >&2; exit 1; }
redis-server --version
