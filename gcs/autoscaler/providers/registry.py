"""Provider name (``provider.type`` of the cluster config) -> its factory.

Adding a provider is one module with a factory (``build(context) -> CloudProvider``, see
:mod:`gcs.autoscaler.providers.base`) and one row here.  A row names the factory as
``"module:function"``, imported only when a cluster uses that provider, so this table has no
imports of its own and the config layer can check names against it.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from gcs.autoscaler.providers.base import ProviderFactory

__all__ = ["PROVIDERS", "Registry", "factory"]

Registry = Mapping[str, str]

PROVIDERS: Registry = MappingProxyType(
    {
        "local": "gcs.autoscaler.providers.local:build",
        "command": "gcs.autoscaler.providers.command:build",
        "read-only": "gcs.autoscaler.providers.read_only:build",
        "kuberay": "gcs.autoscaler.providers.kuberay.provider:build",
    }
)


def factory(name: str, registry: Registry = PROVIDERS) -> ProviderFactory:
    """The factory registered as ``name`` (KeyError if there is none)."""
    return cast("ProviderFactory", pkgutil.resolve_name(registry[name]))
