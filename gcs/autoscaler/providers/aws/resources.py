"""Node type resources from the cloud's own description, by Ray 2.60's rules
(``AWSNodeProvider.fillout_available_node_types_resources``):

- ``CPU``: ``VCpuInfo.DefaultVCpus``;
- ``memory``: ``MemoryInfo.SizeInMiB`` in bytes, the instance's whole memory (the config
  layer applies Ray's rule: workers only, less the object store's share; see
  :mod:`gcs.autoscaler.node_resources`);
- ``GPU``: ``GpuInfo.Gpus[0].Count`` with ``accelerator_type:<Gpus[0].Name>: 1``;
- ``neuron_cores`` with ``accelerator_type:aws-neuron-core: 1`` for the Inferentia and
  Trainium types (their cores are not in the API; Ray keeps a table).

An instance type the region does not offer is an error naming it, as in Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gcs.autoscaler.config import ConfigError
from gcs.autoscaler.providers.aws import errors
from gcs.autoscaler.providers.aws.session import Ec2, make_client
from gcs.autoscaler.providers.aws.settings import credentials
from gcs.base.clock import SystemClock

__all__ = ["fill", "resources_of"]

_NEURON_CORES = {
    "trn1.2xlarge": 2, "trn1.32xlarge": 32, "trn1n.32xlarge": 32, "inf2.xlarge": 2,
    "inf2.8xlarge": 2, "inf2.24xlarge": 12, "inf2.48xlarge": 24,
}  # fmt: skip
"""Ray's ``AWS_NEURON_INSTANCE_MAP``."""


def resources_of(info: Mapping[str, Any]) -> dict[str, float]:
    """One ``InstanceTypeInfo`` of ``describe_instance_types`` -> Ray resources."""
    out: dict[str, float] = {"CPU": float(info["VCpuInfo"]["DefaultVCpus"])}
    mib = int(info.get("MemoryInfo", {}).get("SizeInMiB", 0))
    if mib:
        out["memory"] = float(mib * 1024 * 1024)
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if gpus:
        out["GPU"] = float(gpus[0]["Count"])
        out[f"accelerator_type:{gpus[0]['Name']}"] = 1.0
    neuron = _NEURON_CORES.get(str(info.get("InstanceType", "")).lower())
    if neuron:
        out["neuron_cores"] = float(neuron)
        out["accelerator_type:aws-neuron-core"] = 1.0
    return out


async def fill(
    provider: Mapping[str, Any], node_configs: Mapping[str, Mapping[str, Any]]
) -> Mapping[str, Mapping[str, float]]:
    """The registry row's ``node_type_resources``: resources per node type, from the
    ``InstanceType`` of each node_config (``describe_instance_types`` filtered to the types
    named: one page, where Ray reads the region's whole catalogue)."""
    region = provider.get("region")
    if not isinstance(region, str) or not region:
        raise ConfigError("provider.region: required for provider type aws (e.g. us-west-2)")
    wanted: dict[str, str] = {}
    for name, config in node_configs.items():
        kind = (config or {}).get("InstanceType")
        if not isinstance(kind, str) or not kind:
            raise ConfigError(
                f"available_node_types.{name}.node_config.InstanceType: required for "
                "provider type aws"
            )
        wanted[name] = kind
    if not wanted:
        return {}
    ec2 = Ec2(make_client(region, credentials(provider.get("aws_credentials"))), SystemClock())
    try:
        infos = await ec2.pages(
            "describe_instance_types",
            "InstanceTypes",
            Filters=[{"Name": "instance-type", "Values": sorted(set(wanted.values()))}],
        )
    except Exception as err:
        raise ConfigError(
            f"provider: cannot describe the instance types of {region}: {errors.describe(err)}"
        ) from None
    by_type = {i["InstanceType"]: i for i in infos}
    out: dict[str, dict[str, float]] = {}
    for name, kind in wanted.items():
        if kind not in by_type:
            raise ConfigError(
                f"available_node_types.{name}.node_config.InstanceType: {kind} is not "
                f"available in AWS region {region}"
            )
        out[name] = resources_of(by_type[kind])
    return out
