"""Ray 2.60's ``ray/autoscaler/aws/defaults.yaml``, what Ray merges under an AWS cluster
YAML (top-level keys, the YAML's winning; see ``config.with_defaults``).  Kept as data here
so the package ships no YAML files; ``tests/autoscaler/test_ray_cluster_yaml.py`` checks it
against the copy of Ray's file in the test data."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["defaults"]

_RAY_WHEEL = (
    "https://s3-us-west-2.amazonaws.com/ray-wheels/latest/"
    "ray-3.0.0.dev0-cp310-cp310-manylinux2014_x86_64.whl"
)

_DEFAULTS: dict[str, Any] = {
    "cluster_name": "default",
    "max_workers": 2,
    "upscaling_speed": 1.0,
    "docker": {},
    "idle_timeout_minutes": 5,
    "provider": {
        "type": "aws",
        "region": "us-west-2",
        "availability_zone": "us-west-2a,us-west-2b",
        "cache_stopped_nodes": True,
    },
    "auth": {"ssh_user": "ubuntu"},
    "available_node_types": {
        "ray.head.default": {
            "resources": {},
            "node_config": {
                "InstanceType": "m5.large",
                "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 256}}],
            },
        },
        "ray.worker.default": {
            "min_workers": 0,
            "resources": {},
            "node_config": {
                "InstanceType": "m5.large",
                "InstanceMarketOptions": {"MarketType": "spot"},
            },
        },
    },
    "head_node_type": "ray.head.default",
    "file_mounts": {},
    "cluster_synced_files": [],
    "file_mounts_sync_continuously": False,
    "rsync_exclude": [],
    "rsync_filter": [],
    "initialization_commands": [],
    "setup_commands": [
        "(stat $HOME/anaconda3/envs/tensorflow2_p310/ &> /dev/null && echo 'export "
        'PATH="$HOME/anaconda3/envs/tensorflow2_p310/bin:$PATH"\' >> ~/.bashrc) || true',
        f'which ray || pip install -U "ray[default] @ {_RAY_WHEEL}"',
    ],
    "head_setup_commands": ["pip install 'boto3>=1.4.8'"],
    "worker_setup_commands": [],
    "head_start_ray_commands": [
        "ray stop",
        "ulimit -n 65536; ray start --head --port=6379 --object-manager-port=8076 "
        "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=0.0.0.0",
    ],
    "worker_start_ray_commands": [
        "ray stop",
        "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076",
    ],
}


def defaults() -> dict[str, Any]:
    """A fresh copy (callers may change what they get)."""
    return copy.deepcopy(_DEFAULTS)
