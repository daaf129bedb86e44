"""The ``aws`` row's section: Ray's provider keys and each node type's ``node_config``.

Keys as Ray 2.60's cluster launcher reads them (``ray-schema.json`` and its AWS provider):
``region`` (required), ``availability_zone`` (comma-separated, tried in order),
``cache_stopped_nodes`` (default true: stop instead of terminate, start stopped ones before
launching new), ``use_internal_ips``, ``security_group``, ``aws_credentials`` (keyword
arguments of a boto3 session), plus keys Ray accepts that only ``ray up`` uses
(``key_pair``, ``cloudwatch``, ``tags``, ...).  The endpoint is boto3's own affair
(``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL``): no key of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gcs.autoscaler.config import ConfigError

__all__ = ["AwsSettings", "NodeLaunch", "credentials", "section"]

DEFAULT_AMI = {
    "us-east-1": "ami-0271ce88f6c03e149", "us-east-2": "ami-0ce21b0ce8e0f5a37",
    "us-west-1": "ami-030896954b2b72361", "us-west-2": "ami-0a2b85e15b7c0ac34",
    "ca-central-1": "ami-044b98bea12677052", "eu-central-1": "ami-004d285ecf53fb335",
    "eu-west-1": "ami-0e17ed40febe794a6", "eu-west-2": "ami-0ad9e6b9d4e22df1a",
    "eu-west-3": "ami-05698775025146698", "sa-east-1": "ami-004b19c7ed8d790bc",
    "ap-northeast-1": "ami-03e45b1f18378ea97", "ap-northeast-2": "ami-095bae3e623e2ff99",
    "ap-northeast-3": "ami-02fd0ba69c1ef37ad", "ap-southeast-1": "ami-03ef1223872072e95",
    "ap-southeast-2": "ami-0bcf4f75e44e0a866",
}  # fmt: skip
"""Ray 2.60's ``DEFAULT_AMI`` (Deep Learning AMI, Ubuntu 18.04, V71.0) by region: the image
of a node_config without ``ImageId`` (or with ``latest_dlami``), as ``ray up`` fills it in."""

_CREDENTIAL_KEYS = frozenset(
    {"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "profile_name"}
)
_NOT_PASSED = frozenset({"SubnetIds", "SubnetId", "MinCount", "MaxCount", "UserData"})
"""node_config keys the provider sets itself (subnets are tried in order)."""


@dataclass(frozen=True, slots=True)
class NodeLaunch:
    """What launching one node type takes."""

    node_config: Mapping[str, Any]
    """``run_instances`` arguments as given (InstanceType, ImageId, InstanceMarketOptions,
    TagSpecifications, ...), less the keys the provider sets."""
    subnets: tuple[str, ...] = ()
    """``SubnetIds`` (or ``SubnetId``) of the node_config, tried in order."""

    @property
    def spot(self) -> bool:
        market = self.node_config.get("InstanceMarketOptions") or {}
        return isinstance(market, Mapping) and market.get("MarketType") == "spot"


@dataclass(frozen=True, slots=True)
class AwsSettings:
    region: str
    availability_zones: tuple[str, ...] = ()
    cache_stopped_nodes: bool = True
    use_internal_ips: bool = False
    credentials: Mapping[str, str] = field(default_factory=dict)
    node_types: Mapping[str, NodeLaunch] = field(default_factory=dict)


def _flag(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"provider.{key}: expected true or false, got {value!r}")
    return value


def credentials(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("provider.aws_credentials: expected a mapping")
    unknown = sorted(str(k) for k in value if k not in _CREDENTIAL_KEYS)
    if unknown:
        raise ConfigError(
            f"provider.aws_credentials.{unknown[0]}: unknown key (one of "
            f"{', '.join(sorted(_CREDENTIAL_KEYS))})"
        )
    return {str(k): str(v) for k, v in value.items()}


def node_launch(name: str, node: Mapping[str, Any], region: str) -> NodeLaunch:
    where = f"available_node_types.{name}.node_config"
    config = node.get("node_config")
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: required for provider type aws (InstanceType, ImageId)")
    kind = config.get("InstanceType")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{where}.InstanceType: required for provider type aws")
    subnets = config.get("SubnetIds", [config["SubnetId"]] if "SubnetId" in config else [])
    if not isinstance(subnets, list) or not all(isinstance(s, str) and s for s in subnets):
        raise ConfigError(f"{where}.SubnetIds: expected a list of subnet ids")
    market = config.get("InstanceMarketOptions")
    if market is not None and (
        not isinstance(market, Mapping) or market.get("MarketType") not in ("spot", None)
    ):
        raise ConfigError(f"{where}.InstanceMarketOptions.MarketType: expected spot")
    kept = {str(k): v for k, v in config.items() if k not in _NOT_PASSED}
    if str(kept.get("ImageId", "")).lower() in ("", "latest_dlami"):
        if region not in DEFAULT_AMI:
            raise ConfigError(f"{where}.ImageId: required (no default image for region {region})")
        kept["ImageId"] = DEFAULT_AMI[region]
    return NodeLaunch(kept, tuple(subnets))


def section(raw: Mapping[str, Any], types_raw: Mapping[Any, Any]) -> AwsSettings:
    """The registry row's section parser."""
    region = raw.get("region")
    if not isinstance(region, str) or not region.strip():
        raise ConfigError("provider.region: required for provider type aws (e.g. us-west-2)")
    zones = raw.get("availability_zone", "")
    if not isinstance(zones, str):
        raise ConfigError(f"provider.availability_zone: expected 'zone,zone', got {zones!r}")
    types: dict[str, NodeLaunch] = {}
    for name, node in types_raw.items():
        if not isinstance(node, Mapping):
            continue  # the config layer names it
        types[str(name)] = node_launch(str(name), node, region.strip())
    return AwsSettings(
        region=region.strip(),
        availability_zones=tuple(z.strip() for z in zones.split(",") if z.strip()),
        cache_stopped_nodes=_flag(raw, "cache_stopped_nodes", True),
        use_internal_ips=_flag(raw, "use_internal_ips", False),
        credentials=credentials(raw.get("aws_credentials")),
        node_types=types,
    )
