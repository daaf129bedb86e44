"""The provider contract (Ray 2.60 §2.7): list, launch, terminate, poll errors.

Assumptions, as Ray's ``ICloudInstanceProvider``: the cloud is eventually consistent and
asynchronous (what a call asked for shows up in a later listing), and cloud instance ids
are unique.  Every method's contract, which ``tests/autoscaler/test_provider_contract.py``
checks on every provider in :data:`~gcs.autoscaler.providers.registry.PROVIDERS` (with
``gcs.testing.cloud.FakeCloudProvider`` as the reference):

- :meth:`CloudProvider.get_non_terminated` lists every instance the provider runs for this
  cluster that is not terminated, keyed by cloud instance id.  It is a pure read: it never
  launches, terminates or resizes anything and writes nothing to the cloud or the GCS
  (upkeep of that kind is :meth:`Upkeep.upkeep`, a step of its own).  It raises
  :class:`CloudUnavailable` when the cloud cannot be read; the round that called it is then
  aborted and nothing else happens.
- :meth:`CloudProvider.launch` asks for ``{node_type: count}`` under ``request_id`` and
  returns without waiting for the instances; they appear later in the listing, tagged with
  ``request_id`` where the cloud can carry it (``CloudInstance.request_id``, else "").
  Calling it again with the same ``request_id`` is a no-op (idempotent), so a restarted
  autoscaler can replay a launch it is unsure about.
- :meth:`CloudProvider.terminate` likewise, idempotent per ``request_id``.  An id that is
  unknown or already gone is not an error: there is nothing left to do.
- Launches and terminations never raise for a cloud failure: each failure is reported once
  by :meth:`CloudProvider.poll_errors` as a typed :class:`LaunchNodeError` (per node type,
  with the count that failed) or :class:`TerminateNodeError` (per instance), so a slow or
  failing cloud never blocks a round.
- :attr:`CloudProvider.capabilities` declares what else the provider does
  (:class:`Capabilities`); the autoscaler never guesses it from the provider's type.
  A read-only provider's launch and terminate do nothing and report nothing.

A provider is built by its factory (:data:`ProviderFactory`) from a
:class:`ProviderContext`; the factory is one row of the registry.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from gcs.autoscaler.providers.registry import PROVIDERS, Registry
from gcs.base.errors import Unavailable
from gcs.policy.autoscaling.model import (
    LaunchErrorKind,
    LaunchNodeError,
    NodeKind,
    ProviderError,
    TerminateNodeError,
)
from gcs.policy.autoscaling.scheduler.types import IpprStatus, Resize

if TYPE_CHECKING:
    from gcs.autoscaler.config import ClusterConfig
    from gcs.autoscaler.gcs_api import ProviderGcs
    from gcs.base.clock import Clock
    from gcs.policy.autoscaling.model import RayNode

__all__ = [
    "Capabilities",
    "CloudInstance",
    "CloudProvider",
    "CloudUnavailable",
    "ConfigSource",
    "LaunchErrorKind",
    "LaunchNodeError",
    "PodResizer",
    "ProviderContext",
    "ProviderError",
    "ProviderFactory",
    "TerminateNodeError",
    "Upkeep",
    "provider_factory",
]


@dataclass(frozen=True, slots=True)
class CloudInstance:
    cloud_instance_id: str
    node_type: str
    node_kind: NodeKind = NodeKind.WORKER
    is_running: bool = True
    request_id: str = ""


class CloudUnavailable(Unavailable):
    """The cloud could not be read (listing); nothing was changed."""


class PodResizer(Protocol):
    """Resizes instances in place (KubeRay IPPR)."""

    def ippr_statuses(self) -> Mapping[str, IpprStatus]:
        """Resize state per cloud instance id, as of the last listing."""
        ...

    async def resize(self, resizes: Sequence[Resize], nodes: Sequence[RayNode]) -> None:
        """Carry out the scheduler's resizes; ``nodes`` are this round's Ray nodes."""
        ...


class Upkeep(Protocol):
    """The provider's own writes that follow from what it last listed (KubeRay: completed
    resizes to the raylets, finished deletions, idle termination of the cluster)."""

    async def upkeep(self) -> None:
        """Run once per round, after the listing and before the GCS is read (so the GCS
        already shows what it changed).  Failures are logged and retried next round."""
        ...


ConfigSource = Callable[[], "ClusterConfig | None"]
"""The cluster config as the provider last read it (None before its first listing)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a provider does beyond the contract, declared by the provider itself."""

    read_only: bool = False
    """Reports what runs; never launches or terminates (the reconciler only mirrors)."""
    starts_head: bool = False
    """The autoscaler brings up the head node type at start if no head runs (``ray up``)."""
    ends_with_server: bool = False
    """Embedded in ``gcs serve``, its instances live and die with the server (local
    processes): closing the embedded autoscaler terminates them."""
    resizer: PodResizer | None = None
    """Carries out the scheduler's in-place resizes."""
    upkeep: Upkeep | None = None
    """A step of its own in every round, after the listing."""
    config_source: ConfigSource | None = None
    """The cluster config is re-read from the cloud (KubeRay's RayCluster) every round."""
    notices: Callable[[], list[str]] | None = None
    """What the provider has to say in words since the last call, beyond errors (the cloud
    throttling its calls): each line becomes an autoscaler event, read once per round."""


class CloudProvider(Protocol):
    @property
    def capabilities(self) -> Capabilities: ...

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]: ...

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None: ...

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None: ...

    def poll_errors(self) -> list[ProviderError]:
        """Errors since the last call (each reported once)."""
        ...


@dataclass(frozen=True, slots=True)
class ProviderContext:
    """Everything a provider factory may use, the same for every provider.  What only one
    provider needs (KubeRay's API client) it builds itself from its own config section
    (``cluster.provider.settings``, see :mod:`~gcs.autoscaler.providers.registry`)."""

    cluster: ClusterConfig
    gcs_address: str
    """``host:port`` the instances' raylets register with."""
    gcs: ProviderGcs
    clock: Clock
    state_dir: Path
    """Where a provider keeps what it must remember across restarts (local processes)."""
    child_env: Mapping[str, str] = field(default_factory=dict)
    """Environment for processes a provider starts (e.g. the auth token)."""


ProviderFactory = Callable[[ProviderContext], CloudProvider]


def provider_factory(name: str, registry: Registry = PROVIDERS) -> ProviderFactory:
    """The factory registered as ``name`` (KeyError if there is none), imported now."""
    return cast("ProviderFactory", pkgutil.resolve_name(registry[name].factory))
