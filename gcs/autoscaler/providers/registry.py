"""Provider type (``provider.type`` of the cluster config) -> its row.

Adding a provider is one module and one row here.  A row names the provider's parts as
``"module:name"``, imported only when a cluster uses that provider, so this table imports
nothing and every layer can read it (the config layer checks types and keys against it):

- ``factory`` builds the provider from a :class:`~gcs.autoscaler.providers.base.
  ProviderContext` (:data:`~gcs.autoscaler.providers.base.ProviderFactory`); a provider
  that needs a client of its own cloud builds it there, from its own config section;
- ``keys`` are the provider's own keys of the ``provider:`` mapping (beyond ``type``,
  ``state_dir`` and Ray's launcher keys every provider accepts); any other key is an error;
- ``section`` (optional) validates them, and the node types' ``node_config`` where the
  provider reads it, into a value of its own (``ProviderConfig.settings``, see
  :data:`~gcs.autoscaler.config.SectionParser`);
- ``cloud_config`` (optional) reads the cluster config from the cloud itself, for
  ``gcs autoscaler run --provider TYPE`` without a YAML (KubeRay: the RayCluster; see
  :data:`~gcs.autoscaler.config.CloudConfigReader`); ``config_source`` names what it reads
  in messages.

A test adds a toy provider with :meth:`Registry.with_rows` and passes that registry in
(``providers=`` of config and runtime, the ``obj`` of the command line's context).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

__all__ = ["PROVIDERS", "ProviderRow", "Registry"]


@dataclass(frozen=True, slots=True)
class ProviderRow:
    type: str
    """``provider.type`` in the cluster YAML."""
    factory: str
    """``"module:function"``: ``build(ProviderContext) -> CloudProvider``."""
    keys: frozenset[str] = frozenset()
    """The provider's own keys of the ``provider:`` mapping."""
    section: str = ""
    """``"module:function"``: the section parser ("" = the keys are kept as given)."""
    cloud_config: str = ""
    """``"module:function"``: reads the cluster config from the cloud ("" = from a YAML
    only)."""
    config_source: str = ""
    """What ``cloud_config`` reads, for messages ("the RayCluster")."""
    node_type_resources: str = ""
    """``"module:function"``: ``async fill(provider, node_configs) -> {node type:
    resources}``, the resources the cloud's own description gives each node type (Ray
    fills ``resources: {}`` so; "" = the YAML's resources only)."""


class Registry(Mapping[str, ProviderRow]):
    """Rows by type, in the order given."""

    __slots__ = ("_rows",)

    def __init__(self, *rows: ProviderRow) -> None:
        self._rows: dict[str, ProviderRow] = {}
        for row in rows:
            if row.type in self._rows:
                raise ValueError(f"provider type {row.type!r} is registered twice")
            self._rows[row.type] = row

    def __getitem__(self, name: str) -> ProviderRow:
        return self._rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"Registry({', '.join(self._rows)})"

    def with_rows(self, *rows: ProviderRow) -> Registry:
        """This registry plus ``rows`` (a type registered twice is a ValueError)."""
        return Registry(*self._rows.values(), *rows)

    def cloud_config_types(self) -> list[str]:
        """Types whose cluster config can be read from the cloud, in order."""
        return [name for name, row in self._rows.items() if row.cloud_config]


_ROWS = "gcs.autoscaler.providers"

PROVIDERS = Registry(
    ProviderRow("local", f"{_ROWS}.local:build"),
    ProviderRow("command", f"{_ROWS}.command:build", section=f"{_ROWS}.command:section"),
    ProviderRow("read-only", f"{_ROWS}.read_only:build"),
    ProviderRow(
        "kuberay",
        f"{_ROWS}.kuberay.provider:build",
        keys=frozenset({"namespace", "cluster_name"}),
        section=f"{_ROWS}.kuberay.connect:section",
        cloud_config=f"{_ROWS}.kuberay.connect:read_cluster",
        config_source="the RayCluster",
    ),
    ProviderRow(
        "aws",
        f"{_ROWS}.aws.provider:build",
        keys=frozenset(
            {
                "region",
                "availability_zone",
                "cache_stopped_nodes",
                "use_internal_ips",
                "security_group",
                "aws_credentials",
                "key_pair",
                "cloudwatch",
                "subnet_id",
                "tags",
                "use_external_head_ip",
                "external_head_ip",
                "vpc_id",
            }
        ),  # Ray 2.60's AWS keys (schema and provider); fmt: skip
        section=f"{_ROWS}.aws.settings:section",
        node_type_resources=f"{_ROWS}.aws.resources:fill",
    ),
)
