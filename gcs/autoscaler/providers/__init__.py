"""Cloud instance providers behind one small contract (:mod:`.base`)."""

from gcs.autoscaler.providers.base import (
    CloudInstance,
    CloudProvider,
    LaunchNodeError,
    ProviderError,
    TerminateNodeError,
)

__all__ = [
    "CloudInstance",
    "CloudProvider",
    "LaunchNodeError",
    "ProviderError",
    "TerminateNodeError",
]
