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
  in messages;
- ``node_type_resources`` (optional) says what the cloud's own description of each node
  type's instance gives (:data:`~gcs.autoscaler.node_resources.NodeTypeResources`):
  ``async def fill(provider: Mapping[str, Any], node_configs: Mapping[str, Mapping[str,
  Any]]) -> Mapping[str, Mapping[str, float]]`` -- given the ``provider:`` section and each
  node type's ``node_config`` by node type name (types without one left out), the
  resources by node type name (``CPU``, ``GPU``, ``memory`` = the instance's memory in
  bytes, ``accelerator_type:<X>``: 1, ...); a ConfigError naming the node type when the
  cloud does not describe its instance, any other error is reported as one line; the
  config layer applies Ray's rules (memory only for workers, less the object store's
  share; the YAML's ``resources`` keys win).  Without it a node type the autoscaler may
  launch must spell out its ``resources``;
- ``launcher_keys`` (optional): the cluster-launcher keys the provider acts on (top-level
  names such as ``setup_commands``, ``docker``, ``auth``; a node type's as
  ``available_node_types.*.worker_setup_commands``); it reads them from
  ``ClusterConfig.launcher``.  The launcher keys no one acts on are named in one warning;
- ``defaults`` (optional): ``"module:function"``, ``() -> Mapping`` -- Ray's
  ``defaults.yaml`` for this provider type, under the YAML as Ray's ``fillout_defaults``
  does (top-level keys; the YAML's win).

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
    """``"module:function"``: the resources the cloud describes per node type ("" = the
    YAML's ``resources`` only)."""
    launcher_keys: frozenset[str] = frozenset()
    """Cluster-launcher keys the provider acts on (``setup_commands``,
    ``available_node_types.*.worker_setup_commands``, ...)."""
    defaults: str = ""
    """``"module:function"``: Ray's ``defaults.yaml`` for this type ("" = none)."""


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
        # what it acts on; Ray's other provider keys (security_group, subnet_id, tags,
        # use_internal_ips, cloudwatch) are accepted and named in the one warning
        keys=frozenset({"region", "availability_zone", "cache_stopped_nodes", "aws_credentials"}),
        section=f"{_ROWS}.aws.settings:section",
        launcher_keys=frozenset(
            {
                "setup_commands",
                "worker_setup_commands",
                "initialization_commands",
                "available_node_types.*.worker_setup_commands",
                "available_node_types.*.initialization_commands",
            }
        ),
        defaults=f"{_ROWS}.aws.defaults:defaults",
        node_type_resources=f"{_ROWS}.aws.resources:fill",
    ),
)
