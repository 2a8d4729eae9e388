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
# policy-rc.d answering 101 stops the package's scripts from starting the service.
created_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  created_policy=1
fi
cleanup() { if [ -n "$created_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends redis-server >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends redis-server >/dev/null
fi
command -v redis-server >/dev/null 2>&1 || { echo "redis-server still missing after install" >&2; exit 1; }
redis-server --version
