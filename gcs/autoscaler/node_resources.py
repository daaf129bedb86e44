"""A node type's resources as Ray fills them in from the cloud's description of its
instance type (Ray 2.60, ``AWSNodeProvider.fillout_available_node_types_resources``).

The provider row's ``node_type_resources`` hook (see
:mod:`~gcs.autoscaler.providers.registry`) says what the cloud describes per node type:
``CPU`` (vCPUs), ``memory`` (the instance's memory in bytes), ``GPU`` / other accelerators
and ``accelerator_type:<X>``.  Ray's rules, applied here for every provider:

- only worker types get a ``memory`` resource, and it is the memory less the object
  store's default share (``DEFAULT_OBJECT_STORE_MEMORY_PROPORTION`` = 0.3), as an integer;
- the keys the YAML gives in ``resources`` win over the detected ones, key by key.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gcs.autoscaler.launcher_yaml import ConfigError

NodeTypeResources = Callable[
    [Mapping[str, Any], Mapping[str, Mapping[str, Any]]],
    Awaitable[Mapping[str, Mapping[str, float]]],
]
"""A provider row's ``node_type_resources``: ``(provider section, node_config by node type)
-> resources by node type``; :class:`ConfigError` (one line naming the node type or key) if
the cloud does not describe a node type's instance."""

OBJECT_STORE_MEMORY_PROPORTION = 0.3
"""Ray's ``DEFAULT_OBJECT_STORE_MEMORY_PROPORTION``: the share of a node's memory kept for the
object store, so not advertised as the ``memory`` resource."""


def checked(found: Any, kind: str, asked: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The hook's answer as numbers, each bad entry named."""
    if not isinstance(found, Mapping):
        raise ConfigError(f"provider.type {kind}: the node types' resources are not a mapping")
    out: dict[str, dict[str, float]] = {}
    for name, resources in found.items():
        where = f"available_node_types.{name}.resources"
        if name not in asked:
            raise ConfigError(f"{where}: provider.type {kind} described an unknown node type")
        if not isinstance(resources, Mapping):
            raise ConfigError(f"{where}: provider.type {kind} gave {resources!r}")
        row: dict[str, float] = {}
        for key, value in resources.items():
            if (
                not isinstance(key, str)
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(f"{where}.{key}: provider.type {kind} gave {value!r}")
            row[key] = float(value)
        out[str(name)] = row
    return out


def merged(detected: Mapping[str, float], given: Mapping[str, Any], *, is_head: bool) -> dict:
    """Ray's merge: the detected resources (memory only for workers, less the object store's
    share), updated with the ones the YAML gives."""
    out: dict[str, Any] = dict(detected)
    memory = out.pop("memory", None)
    if memory is not None and not is_head:
        out["memory"] = int(memory * (1 - OBJECT_STORE_MEMORY_PROPORTION))
    out.update(given)
    return out
