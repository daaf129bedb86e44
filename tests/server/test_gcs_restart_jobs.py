"""Jobs across node deaths and GCS restarts (Ray's ``GcsJobManager::OnNodeDead``).

A job whose driver ran on a node that dies is finished; a GCS killed between persisting a
node's death and finishing its jobs finishes them when it loads again.
"""

from __future__ import annotations

from google.protobuf.message import Message

from gcs.base.clock import FakeClock
from gcs.managers.events import JobEvents, NodeEvents
from gcs.managers.jobs import JobManager
from gcs.managers.nodes import NodeManager
from gcs.proto import common_pb2, gcs_pb2, pubsub_pb2
from gcs.store import Store
from gcs.store.memory import MemoryStore

Reason = common_pb2.NodeDeathInfo.Reason


def node(n: int) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=bytes([n]) * 28,
        node_manager_address="127.0.0.2",
        node_manager_port=40000 + n,
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )


def job(n: int, driver_node: int) -> gcs_pb2.JobTableData:
    return gcs_pb2.JobTableData(
        job_id=n.to_bytes(4, "little"),
        driver_address=common_pb2.Address(node_id=bytes([driver_node]) * 28, port=1),
    )


class Gcs:
    """The node and job managers as ``gcs.server.app`` wires them, on ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.clock = FakeClock()
        self.finished: list[bytes] = []
        self.published: list[gcs_pb2.JobTableData] = []
        node_events = NodeEvents()
        self.nodes = NodeManager(store, self.clock, events=node_events)
        self.jobs = JobManager(
            store,
            self.clock,
            events=JobEvents(self),
            publish=self._publish,
            node_is_dead=self.nodes.is_dead,
        )
        node_events.subscribe(self.jobs.node_listener)

    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        return None

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
        self.finished.append(job.job_id)

    def _publish(self, channel: int, key: bytes, message: Message) -> None:
        assert channel == pubsub_pb2.GCS_JOB_CHANNEL
        assert isinstance(message, gcs_pb2.JobTableData)
        self.published.append(message)

    async def load(self) -> Gcs:
        await self.nodes.load()
        await self.jobs.load()
        return self

    def dead_jobs(self) -> set[int]:
        return {int.from_bytes(j.job_id, "little") for j in self.jobs.jobs.values() if j.is_dead}


async def test_a_node_death_finishes_the_jobs_whose_driver_ran_there() -> None:
    gcs = await Gcs(MemoryStore()).load()
    for n in (1, 2):
        await gcs.nodes.register(node(n))
    for n, driver_node in ((1, 1), (2, 2), (3, 1)):
        await gcs.jobs.add(job(n, driver_node))
    await gcs.jobs.mark_finished((3).to_bytes(4, "little"))
    gcs.published.clear()

    await gcs.nodes.mark_dead(node(1).node_id, Reason.UNEXPECTED_TERMINATION, "gone")
    await gcs.jobs.settle()
    assert gcs.dead_jobs() == {1, 3}
    assert [(p.job_id, p.is_dead) for p in gcs.published] == [((1).to_bytes(4, "little"), True)]
    # persisted: a restarted GCS sees it
    again = await Gcs(gcs.store).load()
    assert again.dead_jobs() == {1, 3}


async def test_a_job_whose_driver_node_died_before_a_kill_9_is_finished_on_restart() -> None:
    """The node's death was persisted, its driver's job's not (the GCS was killed in
    between): the restarted GCS finishes the job (its listeners hear of it)."""
    store = MemoryStore()
    gcs = await Gcs(store).load()
    for n in (1, 2):
        await gcs.nodes.register(node(n))
    await gcs.jobs.add(job(1, 1))
    await gcs.jobs.add(job(2, 2))
    crashed = NodeManager(store, gcs.clock)  # no listeners: the job never heard of it
    await crashed.load()
    await crashed.mark_dead(node(1).node_id, Reason.UNEXPECTED_TERMINATION, "gone")

    again = await Gcs(store).load()
    assert again.dead_jobs() == {1}
    assert again.finished == [(1).to_bytes(4, "little")]
    assert again.jobs.jobs[(1).to_bytes(4, "little")].end_time > 0
