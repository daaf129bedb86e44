"""A toy provider: what adding a provider takes -- this one file, plus one registry row
(``TOY_ROW`` below, registered in ``TOY_PROVIDERS``; in production the row goes into
``gcs.autoscaler.providers.registry.PROVIDERS``).

Its "cloud" is a dict: a launch creates the instances at once, tagged with the request id.
Registered, it is a provider like the others by its type name ``toy``: the contract suite
runs it (``test_provider_contract``), a cluster YAML and ``gcs autoscaler plan`` take it
(``test_toy_provider``), and ``test_runtime_component`` runs the whole autoscaler on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    LaunchNodeError,
    ProviderContext,
    ProviderError,
)
from gcs.autoscaler.providers.registry import PROVIDERS, ProviderRow
from gcs.base.clock import Clock
from gcs.policy.autoscaling.model import NodeKind

TOY_ROW = ProviderRow("toy", "tests.autoscaler.toy_provider:build")
TOY_PROVIDERS = PROVIDERS.with_rows(TOY_ROW)


class ToyProvider:
    capabilities = Capabilities(starts_head=True)

    def __init__(self, node_types: Mapping[str, NodeKind], clock: Clock) -> None:
        self._kinds = dict(node_types)
        self._clock = clock
        self._ids = itertools.count(1)
        self._done: set[str] = set()
        self._errors: list[ProviderError] = []
        self.instances: dict[str, CloudInstance] = {}

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        return dict(self.instances)

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        if request_id in self._done:
            return
        self._done.add(request_id)
        for node_type, count in shape.items():
            kind = self._kinds.get(node_type)
            if kind is None:
                now_ns = int(self._clock.now_s() * 1e9)
                self._errors.append(
                    LaunchNodeError(node_type, count, request_id, now_ns, "no such node type")
                )
                continue
            for _ in range(count):
                cid = f"toy-{next(self._ids)}"
                self.instances[cid] = CloudInstance(cid, node_type, kind, True, request_id)

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        if request_id in self._done:
            return
        self._done.add(request_id)
        for cid in cloud_instance_ids:
            self.instances.pop(cid, None)

    def poll_errors(self) -> list[ProviderError]:
        errors, self._errors = self._errors, []
        return errors


def build(context: ProviderContext) -> ToyProvider:
    head = context.cluster.head_node_type
    kinds = {
        name: NodeKind.HEAD if name == head else NodeKind.WORKER
        for name in context.cluster.scheduler.node_types
    }
    return ToyProvider(kinds, context.clock)
