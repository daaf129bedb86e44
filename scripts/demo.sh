#!/usr/bin/env bash
# The main job: the GCS on its embedded SQLite store with a small local demo cluster
# (3 raylet agents of two node types and some synthetic load).  Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/gcs serve --port "${GCS_PORT:-46379}" --demo "${GCS_DEMO_NODES:-3}" "$@"
