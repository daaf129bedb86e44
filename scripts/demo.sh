#!/usr/bin/env bash
# The main job: the GCS on its embedded SQLite store (.gcs-data/) with a small local demo
# cluster, autoscaled: the embedded autoscaler's local provider runs the nodes of
# examples/demo-cluster.yaml (head + 2 cpu4 + 1 gpu1 at least) as raylet processes and a
# steady cycle of synthetic load makes it scale up and back down (GCS_DEMO_AUTOSCALER=0:
# 3 fixed raylet agents instead).
# It listens on 127.0.0.2 (loopback) so Ray's own CLI reaches it too: Ray rewrites
# 127.0.0.1 to the machine's address, which a loopback-only 127.0.0.1 server would not serve.
# Ctrl-C stops everything.  GCS_HOST / GCS_PORT / GCS_METRICS_PORT / GCS_DEMO_NODES override.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
autoscale=(--autoscaler-config examples/demo-cluster.yaml)
if [ "${GCS_DEMO_AUTOSCALER:-1}" = "0" ]; then
  autoscale=()
fi
exec .venv/bin/gcs serve \
  --host "${GCS_HOST:-127.0.0.2}" \
  --port "${GCS_PORT:-46379}" \
  --metrics-port "${GCS_METRICS_PORT:-9379}" \
  --demo "${GCS_DEMO_NODES:-3}" "${autoscale[@]}" "$@"
