"""A provider whose "cloud" is in-process raylet agents: a launch starts a
:class:`~gcs.raylet.agent.RayletAgent` of the node type (real lease handling, so work granted
and queued on it behaves as on a ``gcs raylet`` process), a termination stops it.  Faster
than the local provider's processes and free of their wall-clock waits."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    ProviderContext,
    ProviderError,
)
from gcs.autoscaler.providers.registry import PROVIDERS, ProviderRow
from gcs.policy.autoscaling.model import NodeKind
from gcs.raylet.agent import RayletAgent, RayletConfig

AGENT_PROVIDERS = PROVIDERS.with_rows(
    ProviderRow("agents", "tests.autoscaler.agent_provider:build")
)


class AgentProvider:
    capabilities = Capabilities(starts_head=True, ends_with_server=True)

    def __init__(self, cluster: ClusterConfig, gcs_address: str) -> None:
        self._cluster = cluster
        self._address = gcs_address
        self._ids = itertools.count(1)
        self._done: set[str] = set()
        self.instances: dict[str, CloudInstance] = {}
        self.agents: dict[str, RayletAgent] = {}
        self.claims: dict[str, dict[str, float]] = {}
        """Node type -> a shape each new node of it holds before it registers (work of
        someone else's: it frees when the test says, :meth:`release_claims`)."""
        self._held: dict[str, bytes] = {}

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        return dict(self.instances)

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        if request_id in self._done:
            return
        self._done.add(request_id)
        for node_type, count in shape.items():
            cfg = self._cluster.scheduler.node_types[node_type]
            head = node_type == self._cluster.head_node_type
            for _ in range(count):
                cid = f"agent-{node_type}-{next(self._ids)}"
                kind = NodeKind.HEAD if head else NodeKind.WORKER
                self.instances[cid] = CloudInstance(cid, node_type, kind, True, request_id)
                agent = RayletAgent(
                    RayletConfig(
                        gcs_address=self._address,
                        resources=dict(cfg.resources),
                        node_type=node_type,
                        labels=dict(cfg.labels),
                        instance_id=cid,
                        node_name=cid,
                        is_head=head,
                    )
                )
                self.agents[cid] = agent
                await agent.serve()
                claim = self.claims.get(node_type)
                if claim is not None and agent.servicer is not None:
                    lease = agent.servicer.hold(claim)
                    assert lease is not None, f"{claim} does not fit {node_type}"
                    self._held[cid] = lease
                await agent.start()

    def release_claims(self) -> None:
        for cid, lease in self._held.items():
            agent = self.agents.get(cid)
            if agent is not None and agent.servicer is not None:
                agent.servicer.free(lease)
        self._held.clear()

    def agent_of(self, node_type: str) -> list[RayletAgent]:
        return [a for cid, a in self.agents.items() if self.instances[cid].node_type == node_type]

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        if request_id in self._done:
            return
        self._done.add(request_id)
        for cid in cloud_instance_ids:
            self.instances.pop(cid, None)
            agent = self.agents.pop(cid, None)
            if agent is not None:
                await agent.stop()

    def poll_errors(self) -> list[ProviderError]:
        return []

    async def close(self) -> None:
        await self.terminate(sorted(self.instances), "close")


def build(context: ProviderContext) -> AgentProvider:
    return AgentProvider(context.cluster, context.gcs_address)
