"""Provider name (``provider.type`` of the cluster config) -> its factory.

Adding a provider is one module with a factory (``build(context) -> CloudProvider``, see
:mod:`gcs.autoscaler.providers.base`) and one row here.  A row names the factory as
``"module:function"``, imported only when a cluster uses that provider
(:func:`gcs.autoscaler.providers.base.provider_factory`), so this table has no imports of
its own and the config layer can check names against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["PROVIDERS", "Registry"]

Registry = Mapping[str, str]

PROVIDERS: Registry = MappingProxyType(
    {
        "local": "gcs.autoscaler.providers.local:build",
        "command": "gcs.autoscaler.providers.command:build",
        "read-only": "gcs.autoscaler.providers.read_only:build",
        "kuberay": "gcs.autoscaler.providers.kuberay.provider:build",
    }
)
