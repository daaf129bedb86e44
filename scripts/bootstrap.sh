#!/usr/bin/env bash
# Create (or reuse) the project virtualenv in .venv and install gcs with its test extras.
# Idempotent and quiet when nothing changed; used by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.gcs-installed"
want="$(cat pyproject.toml setup.py protos/gcs/proto/*.proto | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ ! -f gcs/proto/gcs_pb2.py ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".[test,kubernetes]"
  .venv/bin/python setup.py --protos-only
  echo "$want" > "$stamp"
fi
