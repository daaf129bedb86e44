"""Two Ray 2.60 GCS behaviours Ray's ``test_failure_2.py`` checks (and we missed):

* ``test_list_named_actors_timeout``: ``RAY_testing_asio_delay_us`` (Ray's test knob, also in
  ``--config_list``) holds the named GCS handlers, so a driver's short GCS deadline passes;
  ours answered at once and the expected ``GetTimeoutError`` never came;
* ``test_warning_for_dead_node``: a node that dies unexpectedly is announced to every driver
  on the error channel (``node_removed``, the node id as the message's sixth word); ours
  published nothing.
"""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from gcs.base.clock import FakeClock, now_ms
from gcs.base.handler_delays import DelaySpecError, HandlerDelays
from gcs.config import ConfigError, GcsConfig, load_config, validate
from gcs.managers.nodes import NIL_JOB_ID, NODE_REMOVED_ERROR, DrainRecord, NodeManager
from gcs.proto import autoscaler_pb2, common_pb2, gcs_pb2, pubsub_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config
from tests.dropin.test_ray_config import dropin_config

Reason = common_pb2.NodeDeathInfo.Reason
LIST_NAMED = "ActorInfoGcsService.grpc_server.ListNamedActors"


class TestDelaySpec:
    def test_rays_form_per_handler_and_for_the_rest(self) -> None:
        delays = HandlerDelays.parse(f"{LIST_NAMED}=3000000:3000000,*=10:20")
        assert delays.range_us("ActorInfoGcsService", "ListNamedActors") == (3_000_000, 3_000_000)
        assert delays.range_us("NodeInfoGcsService", "GetAllNodeInfo") == (10, 20)
        assert HandlerDelays.parse("") == HandlerDelays()
        never = HandlerDelays.parse("*=0:0")
        assert never.pause_for("A", "B", FakeClock().sleep, random.Random(0)) is None

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("ListNamedActors", "expected NAME=MIN_US:MAX_US"),
            ("a=1", "expected NAME=MIN_US:MAX_US"),
            ("a=1:2:3", "expected NAME=MIN_US:MAX_US"),
            ("a=x:2", "whole microseconds"),
            ("a=5:2", "5 is bigger than 2"),
            (f"{LIST_NAMED}=1:2,", "'': expected"),
        ],
    )
    def test_a_malformed_value_names_the_entry(self, text: str, message: str) -> None:
        with pytest.raises(DelaySpecError, match=message):
            HandlerDelays.parse(text)

    def test_a_malformed_value_stops_the_gcs_at_start_naming_the_knob(self) -> None:
        with pytest.raises(ConfigError) as err:
            validate(GcsConfig(testing_asio_delay_us="a=5:2"))
        assert "testing_asio_delay_us (RAY_testing_asio_delay_us): 'a=5:2'" in str(err.value)

    def test_it_comes_from_the_config_list_or_rays_environment(self) -> None:
        value = f"{LIST_NAMED}=3000000:3000000"
        assert dropin_config({"testing_asio_delay_us": value}).testing_asio_delay_us == value
        env = {"RAY_testing_asio_delay_us": value}
        assert load_config(env=env).testing_asio_delay_us == value

    async def test_each_call_waits_a_draw_in_rays_range(self) -> None:
        waits: list[float] = []

        async def record(seconds: float) -> None:  # the wait asked for, not waited
            waits.append(seconds)

        pause = HandlerDelays.parse("*=100:200").pause_for("S", "M", record, random.Random(7))
        assert pause is not None
        for _ in range(200):
            await pause()
        assert all(100e-6 <= w < 200e-6 for w in waits) and len(set(waits)) > 10


@pytest.mark.parametrize("front_server", [True, False], ids=["front", "grpc-aio"])
async def test_the_named_handler_answers_after_its_delay_and_no_other_waits(
    front_server: bool,
) -> None:
    clock = FakeClock()
    server = GcsServer(
        fast_config(
            front_server=front_server, testing_asio_delay_us=f"{LIST_NAMED}=3000000:3000000"
        ),
        store=MemoryStore(),
        clock=clock,
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            actors = ServiceStub(channel, svc.ACTOR_INFO, timeout_s=30)
            started = clock.monotonic_s()
            held = asyncio.ensure_future(actors.ListNamedActors(G.ListNamedActorsRequest()))
            every = await actors.GetAllActorInfo(G.GetAllActorInfoRequest())
            assert every.total == 0 and not held.done()  # the other method did not wait
            await clock.advance_until(held.done, step_s=0.25)
            assert clock.monotonic_s() - started >= 3.0
            assert (await held).status.code == 0
    finally:
        await server.stop()


def _node(n: int) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=bytes([n]) * 28,
        node_manager_address=f"10.0.0.{n}",
        node_name=f"node-{n}",
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )


class TestNodeRemovedWarning:
    @staticmethod
    async def _nodes() -> tuple[NodeManager, FakeClock, list[tuple[int, bytes, object]]]:
        errors: list[tuple[int, bytes, object]] = []
        clock = FakeClock()
        nodes = NodeManager(
            MemoryStore(), clock, publish_error=lambda *published: errors.append(published)
        )
        await nodes.load()
        return nodes, clock, errors

    async def test_a_health_check_death_is_told_to_every_driver_in_rays_words(self) -> None:
        nodes, clock, errors = await self._nodes()
        node = _node(1)
        await nodes.register(node)
        assert await nodes.fail_unhealthy(node.node_id)
        ((channel, key, error),) = errors
        assert channel == pubsub_pb2.RAY_ERROR_INFO_CHANNEL
        assert key == node.node_id.hex().encode()
        assert isinstance(error, gcs_pb2.ErrorTableData)
        assert error.type == NODE_REMOVED_ERROR and error.job_id == NIL_JOB_ID
        assert error.timestamp == now_ms(clock)
        # Ray's test_warning_for_dead_node reads the id as the sixth word
        assert error.error_message.split(" ")[5] == node.node_id.hex()
        assert error.error_message.startswith(
            f"The node with node id: {node.node_id.hex()} and address: 10.0.0.1 and node name: "
            "node-1 has been marked dead because the detector has missed too many heartbeats"
        )

    async def test_a_raylets_own_unexpected_end_is_told_too(self) -> None:
        nodes, _, errors = await self._nodes()
        node = _node(2)
        await nodes.register(node)
        death = common_pb2.NodeDeathInfo(reason=Reason.UNEXPECTED_TERMINATION)
        assert await nodes.unregister(node.node_id, death)
        assert [key for _, key, _ in errors] == [node.node_id.hex().encode()]

    async def test_expected_ends_and_preemption_are_not_warned(self) -> None:
        nodes, clock, errors = await self._nodes()
        for n in (3, 4, 5):
            await nodes.register(_node(n))
        await nodes.unregister(
            _node(3).node_id, common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION)
        )
        await nodes.mark_dead(_node(4).node_id, Reason.EXPECTED_TERMINATION, "drained")
        nodes.record_drain(
            _node(5).node_id,
            DrainRecord(autoscaler_pb2.DRAIN_NODE_REASON_PREEMPTION, "spot", now_ms(clock) - 1),
        )
        assert await nodes.fail_unhealthy(_node(5).node_id)
        assert nodes.dead[_node(5).node_id].death_info.reason == Reason.AUTOSCALER_DRAIN_PREEMPTED
        assert errors == []
