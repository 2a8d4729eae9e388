#!/usr/bin/env bash
# `make bench` measures a plain nginx beside the gateway, for reference
# (bench.run --nginx). This installs Debian's nginx-light when nginx is
# missing and we are root, without starting its service; otherwise the bench
# skips that column and says so.
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "nginx is missing: the bench's nginx column is skipped (Debian/Ubuntu: sudo apt-get install nginx-light)." >&2
  exit 0
fi
echo "installing nginx-light (the bench starts its own nginx; no service is started)"
bash "$(dirname "$0")/../tests/support/apt-install-no-service.sh" nginx-light
