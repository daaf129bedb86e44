"""The script an instance boots with (EC2 user data, run once by cloud-init as root).

It installs nothing: the image carries Ray.  It runs the node type's setup commands, then
``ray start --address=<this GCS>`` with the node type's resources and labels, and with the
instance's own id (from the instance metadata service, IMDSv2) in ``RAY_CLOUD_INSTANCE_ID``
and the node type in ``RAY_NODE_TYPE_NAME``: the raylet reports both, so the autoscaler
joins the Ray node to its EC2 instance.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

__all__ = ["user_data"]

_IMDS = "http://169.254.169.254/latest"
_PER_BOOT = "/var/lib/cloud/scripts/per-boot/gcs-ray-start.sh"
"""cloud-init runs user data on the first boot only; a copy here runs on every later boot,
so an instance stopped and started again (``cache_stopped_nodes``) rejoins."""
_RESOURCE_FLAGS = {"CPU": "--num-cpus", "GPU": "--num-gpus", "memory": "--memory"}


def _start_command(
    gcs_address: str, resources: Mapping[str, float], labels: Mapping[str, str]
) -> str:
    argv = ["ray", "start", f"--address={gcs_address}"]
    custom: dict[str, float] = {}
    for name, amount in sorted(resources.items()):
        flag = _RESOURCE_FLAGS.get(name)
        if flag is None:
            custom[name] = amount
        else:
            argv.append(f"{flag}={int(amount) if float(amount).is_integer() else amount}")
    if custom:
        argv.append("--resources=" + json.dumps(custom, sort_keys=True, separators=(",", ":")))
    if labels:
        argv.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return shlex.join(argv)


def user_data(
    *,
    cluster: str,
    node_type: str,
    gcs_address: str,
    resources: Mapping[str, float],
    labels: Mapping[str, str],
    setup_commands: Sequence[str],
) -> str:
    lines = [
        "#!/bin/bash",
        f"# gcs autoscaler: cluster {cluster}, node type {node_type}",
        "set -euo pipefail",
        f'[ "$0" = {_PER_BOOT} ] || install -D -m 755 "$0" {_PER_BOOT}',
        *setup_commands,
        f"TOKEN=$(curl -sf -X PUT {_IMDS}/api/token "
        '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")',
        "export RAY_CLOUD_INSTANCE_ID=$(curl -sf -H "
        f'"X-aws-ec2-metadata-token: $TOKEN" {_IMDS}/meta-data/instance-id)',
        f"export RAY_NODE_TYPE_NAME={shlex.quote(node_type)}",
        _start_command(gcs_address, resources, labels),
    ]
    return "\n".join(lines) + "\n"
