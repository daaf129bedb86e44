"""The provider contract (Ray 2.60 §2.7): list, launch, terminate, poll errors.

- :meth:`CloudProvider.get_non_terminated` lists every instance the provider runs for this
  cluster that is not terminated, keyed by cloud instance id.  It may raise: the round that
  called it is aborted and nothing else happens.
- :meth:`CloudProvider.launch` asks for ``{node_type: count}`` under ``request_id`` and
  returns at once; instances appear later in :meth:`get_non_terminated`.  Calling it again
  with the same ``request_id`` is a no-op (idempotent), so a restarted autoscaler can
  replay a launch it is unsure about.
- :meth:`CloudProvider.terminate` likewise, idempotent per ``request_id``.
- Failures of launches and terminations are not raised by those calls: they are reported
  by :meth:`poll_errors` (each error once), so a slow cloud never blocks a round.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gcs.autoscaler.scheduler.types import IpprStatus, NodeKind, Resize

if TYPE_CHECKING:
    from gcs.autoscaler.reconciler.observed import RayNode

__all__ = [
    "CloudInstance",
    "CloudProvider",
    "LaunchErrorKind",
    "LaunchNodeError",
    "PodResizer",
    "ProviderError",
    "TerminateNodeError",
]


@dataclass(frozen=True, slots=True)
class CloudInstance:
    cloud_instance_id: str
    node_type: str
    node_kind: NodeKind = NodeKind.WORKER
    is_running: bool = True
    request_id: str = ""


class LaunchErrorKind(enum.Enum):
    """Why a launch failed, as far as the provider can tell (Karpenter sorts its launch
    errors the same way).  CAPACITY and QUOTA make the autoscaler hold the node type back
    for a while and use other types (:mod:`gcs.autoscaler.capacity`); ERROR is retried."""

    CAPACITY = "capacity"
    """The cloud has no capacity for this node type right now (insufficient capacity)."""
    QUOTA = "quota"
    """An account quota or limit of the cloud refused it."""
    ERROR = "error"
    """Anything else."""


@dataclass(frozen=True, slots=True)
class LaunchNodeError:
    node_type: str
    count: int
    request_id: str
    timestamp_ns: int
    details: str = ""
    kind: LaunchErrorKind = LaunchErrorKind.ERROR


@dataclass(frozen=True, slots=True)
class TerminateNodeError:
    cloud_instance_id: str
    request_id: str
    timestamp_ns: int
    details: str = ""


ProviderError = LaunchNodeError | TerminateNodeError


class CloudProvider(Protocol):
    read_only: bool
    """A read-only provider reports what runs and never launches or terminates."""

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]: ...

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None: ...

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None: ...

    def poll_errors(self) -> list[ProviderError]:
        """Errors since the last call (each reported once)."""
        ...


class PodResizer(Protocol):
    """A provider that resizes instances in place (KubeRay IPPR)."""

    def ippr_statuses(self) -> Mapping[str, IpprStatus]:
        """Resize state per cloud instance id, as of the last listing."""
        ...

    async def resize(self, resizes: Sequence[Resize], nodes: Sequence[RayNode]) -> None:
        """Carry out the scheduler's resizes; ``nodes`` are this round's Ray nodes."""
        ...
