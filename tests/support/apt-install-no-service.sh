#!/usr/bin/env bash
# apt-install-no-service.sh PACKAGE: install a Debian package quietly without
# letting its scripts start a system service (policy-rc.d answering 101, as
# Debian documents for chroots and containers). Root only; the ensure-*.sh
# scripts call it once they know the binary is missing.
set -euo pipefail
package="$1"
created_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  created_policy=1
fi
cleanup() { if [ -n "$created_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends "$package" >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "$package" >/dev/null
fi
