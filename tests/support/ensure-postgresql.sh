#!/usr/bin/env bash
# `make test` needs PostgreSQL's server binaries (initdb, pg_ctl, postgres
# under /usr/lib/postgresql/<major>/bin): the state-store tests start their
# own servers (loopback, a temporary data directory) and stop them by PID.
# This installs the Debian package when the binaries are missing and we are
# root (CI), without starting the system service and without a default
# cluster; otherwise it says what to install.
set -euo pipefail
have_server() {
  local bin
  for bin in /usr/lib/postgresql/*/bin; do
    if [ -x "$bin/initdb" ] && [ -x "$bin/pg_ctl" ] && [ -x "$bin/postgres" ]; then
      return 0
    fi
  done
  # Elsewhere (a source build, Homebrew) the binaries are on PATH.
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 \
    && command -v postgres >/dev/null 2>&1
}
if have_server; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL's server binaries (initdb, pg_ctl, postgres) are missing: the state-store tests need them." >&2
  echo "Install them (Debian/Ubuntu: sudo apt-get install postgresql; macOS: brew install postgresql)." >&2
  exit 1
fi
echo "installing postgresql (the tests start their own servers; no service or cluster is started)"
# postgresql-common's postinst creates a cluster "main" unless
# create_main_cluster is false. createcluster.conf itself is the package's
# conffile (writing it first would make dpkg ask about it); the directory it
# includes is read by the same lookup and is ours to drop a file into.
cluster_conf=/etc/postgresql-common/createcluster.d/00-mistralrs-gateway-tests.conf
created_conf=""
created_dir=""
if [ ! -e "$cluster_conf" ]; then
  if [ ! -d "$(dirname "$cluster_conf")" ]; then
    mkdir -p "$(dirname "$cluster_conf")"
    created_dir=1
  fi
  echo "create_main_cluster = false" > "$cluster_conf"
  created_conf=1
fi
cleanup() {
  if [ -n "$created_conf" ]; then rm -f "$cluster_conf"; fi
  if [ -n "$created_dir" ]; then rmdir "$(dirname "$cluster_conf")" 2>/dev/null || true; fi
}
trap cleanup EXIT
clusters() { if command -v pg_lsclusters >/dev/null 2>&1; then pg_lsclusters -h | awk '{print $1, $2}'; fi; }
before="$(clusters)"
bash "$(dirname "$0")/apt-install-no-service.sh" postgresql
# An older postgresql-common that ignores the include: drop (and stop) any
# cluster the install made, never one that was there before.
while read -r version name; do
  if [ -n "$version" ] && ! grep -qxF "$version $name" <<<"$before"; then
    echo "dropping cluster $version/$name made by the install"
    pg_dropcluster --stop "$version" "$name"
  fi
done <<<"$(clusters)"
have_server || { echo "PostgreSQL's server binaries still missing after install" >&2; exit 1; }
ls -d /usr/lib/postgresql/*/bin
