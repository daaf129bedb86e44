"""A toy ``aws`` row for the cluster-YAML tests: Ray's AWS provider keys, Ray 2.60's AWS
``defaults.yaml`` and a fixed instance catalog as its ``node_type_resources`` -- the seam the
real AWS provider fills from EC2's ``DescribeInstanceTypes`` (its own tests run it against
moto's EC2 server).  It launches with the toy provider (``toy_provider.build``).

The catalog holds EC2's published figures for the types Ray's examples use: m5.large (2
vCPUs, 8 GiB), p2.xlarge (4 vCPUs, 61 GiB, one NVIDIA K80).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gcs.autoscaler.config import ConfigError
from gcs.autoscaler.providers.registry import PROVIDERS, ProviderRow, Registry
from tests.autoscaler.toy_provider import TOY_ROW

DATA = Path(__file__).parent / "data" / "ray_aws"

#: InstanceType -> (vCPUs, memory MiB, GPUs, GPU name), as DescribeInstanceTypes gives them.
CATALOG: dict[str, tuple[int, int, int, str]] = {
    "m5.large": (2, 8192, 0, ""),
    "p2.xlarge": (4, 62464, 1, "K80"),
}

#: Every fill() call: (provider section, node_configs), for the tests to look at.
CALLS: list[tuple[Mapping[str, Any], Mapping[str, Mapping[str, Any]]]] = []


async def fill(
    provider: Mapping[str, Any], node_configs: Mapping[str, Mapping[str, Any]]
) -> Mapping[str, Mapping[str, float]]:
    CALLS.append((dict(provider), {k: dict(v) for k, v in node_configs.items()}))
    out: dict[str, dict[str, float]] = {}
    for name, node_config in node_configs.items():
        kind = node_config.get("InstanceType")
        if kind not in CATALOG:
            raise ConfigError(
                f"available_node_types.{name}.node_config.InstanceType: {kind!r} is not "
                f"offered in {provider.get('region')}"
            )
        cpus, mib, gpus, gpu_name = CATALOG[kind]
        resources: dict[str, float] = {"CPU": cpus, "memory": mib * 2**20}
        if gpus:
            resources["GPU"] = gpus
            resources[f"accelerator_type:{gpu_name}"] = 1
        out[name] = resources
    return out


def defaults() -> Mapping[str, Any]:
    """Ray 2.60's ``ray/autoscaler/aws/defaults.yaml`` (copied verbatim into data/)."""
    loaded: Mapping[str, Any] = yaml.safe_load((DATA / "defaults.yaml").read_text())
    return loaded


TOY_AWS_ROW = ProviderRow(
    "aws",
    "tests.autoscaler.toy_provider:build",
    keys=frozenset({"region", "availability_zone", "cache_stopped_nodes"}),
    node_type_resources="tests.autoscaler.toy_catalog:fill",
    defaults="tests.autoscaler.toy_catalog:defaults",
)
#: This build's rows with ``aws`` as the toy above (in place of the real one, if any), and
#: the plain ``toy`` (no catalog: its YAMLs spell resources out).
TOY_AWS_PROVIDERS = Registry(
    *(row for row in PROVIDERS.values() if row.type != "aws"), TOY_AWS_ROW, TOY_ROW
)
