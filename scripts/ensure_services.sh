#!/usr/bin/env bash
# Install redis-server and PostgreSQL (initdb/postgres) if missing; idempotent.
# The store tests start private servers on free ports (gcs/testing/redis_server.py, postgres.py); they never
# use a machine-wide Redis or PostgreSQL, so the services need not be running.
set -euo pipefail

have_initdb() {
  command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

updated=0
apt_install() {
  if [ "$updated" -eq 0 ]; then $SUDO apt-get update -y; updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "$@"
}

command -v redis-server >/dev/null 2>&1 || apt_install redis-server
have_initdb || apt_install postgresql

redis-server --version
ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null || command -v initdb
