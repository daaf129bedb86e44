"""Ray's GCS metrics for the node's metrics agent: the families under Ray's names (as Ray
2.60's ``gcs_server`` reports them to its agent, read off the agent's Prometheus page),
the delta encoding the agent expects, and the exporter against an in-process agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from gcs.base.clock import FakeClock
from gcs.config import ConfigError, GcsConfig, load_config
from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.proto import otlp_metrics_pb2 as otlp
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.rpc.security import Security
from gcs.server import GcsServer
from gcs.server.metrics_agent import EXPORT_METHOD, MetricsAgentExporter
from gcs.server.ray_metrics import (
    LATENCY_BOUNDS_MS,
    DeltaEncoder,
    Family,
    PlacementGroupLatencies,
    actor_families,
    job_families,
    placement_group_families,
    rebucket,
    store_families,
)
from gcs.store.memory import MemoryStore
from gcs.store.metered import MeteredStore

A = gcs_pb2.ActorTableData
PG = gcs_pb2.PlacementGroupTableData
GLOBAL = {"Component": "gcs_server", "NodeAddress": "10.0.0.1", "WorkerId": ""}


def _actor(state: int, cls: str = "A") -> gcs_pb2.ActorTableData:
    return A(state=state, class_name=cls)  # type: ignore[arg-type]


def _pg(pg_id: int, state: int, **stats: int) -> gcs_pb2.PlacementGroupTableData:
    pg = PG(placement_group_id=bytes([pg_id]) * 18, state=state)  # type: ignore[arg-type]
    for name, value in stats.items():
        setattr(pg.stats, name, value)
    return pg


def _by_name(families: list[Family]) -> dict[str, Family]:
    return {f.name: f for f in families}


def _points(request: otlp.ExportMetricsServiceRequest) -> dict[str, list[dict]]:
    """metric name -> data points as {labels..., "value"/"buckets"}."""
    out: dict[str, list[dict]] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    row: dict = {kv.key: kv.value.string_value for kv in point.attributes}
                    if kind == "histogram":
                        row["buckets"] = list(point.bucket_counts)
                        row["bounds"] = list(point.explicit_bounds)
                    else:
                        row["value"] = point.as_double
                    out.setdefault(metric.name, []).append(row)
    return out


def _metric(request: otlp.ExportMetricsServiceRequest, name: str) -> otlp.Metric:
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    return metric
    raise KeyError(name)


class TestFamilies:
    def test_actors_by_state_and_class_and_rays_internal_tables(self) -> None:
        fams = _by_name(
            actor_families(
                [
                    _actor(A.ALIVE),
                    _actor(A.ALIVE),
                    _actor(A.DEAD),
                    _actor(A.PENDING_CREATION, "B"),
                    _actor(A.RESTARTING, "B"),
                    _actor(A.DEPENDENCIES_UNREADY, "B"),
                ]
            )
        )
        actors = {
            dict(k)["State"] + "/" + dict(k)["Name"]: v for k, v in fams["actors"].values.items()
        }
        assert actors == {
            "ALIVE/A": 2,
            "DEAD/A": 1,
            "PENDING_CREATION/B": 1,
            "RESTARTING/B": 1,
            "DEPENDENCIES_UNREADY/B": 1,
        }
        assert all(
            dict(k)["Source"] == "gcs" and dict(k)["JobId"] == "" for k in fams["actors"].values
        )
        tables = {dict(k)["State"]: v for k, v in fams["gcs_actors_count"].values.items()}
        assert tables == {
            "Registered": 5,
            "Created": 2,
            "Destroyed": 1,
            "Unresolved": 1,
            "Pending": 2,
        }

    def test_placement_groups_by_state_with_rays_zero_series_and_infeasible(self) -> None:
        infeasible = gcs_pb2.PlacementGroupStats.INFEASIBLE
        fams = _by_name(
            placement_group_families(
                [
                    _pg(1, PG.CREATED),
                    _pg(2, PG.PENDING),
                    _pg(3, PG.PENDING, scheduling_state=infeasible),
                    _pg(4, PG.REMOVED),
                ]
            )
        )
        states = {dict(k)["State"]: v for k, v in fams["placement_groups"].values.items()}
        assert states == {"PENDING": 2, "PREPARED": 0, "CREATED": 1, "REMOVED": 1}
        tables = {dict(k)["State"]: v for k, v in fams["gcs_placement_group_count"].values.items()}
        assert tables == {"Registered": 3, "Pending": 1, "Infeasible": 1}
        empty = _by_name(placement_group_families([]))["placement_groups"].values
        assert sorted(dict(k)["State"] for k in empty) == ["CREATED", "PENDING", "PREPARED"]

    def test_jobs_running_and_finished(self) -> None:
        jobs = [gcs_pb2.JobTableData(is_dead=d) for d in (True, True, False)]
        fams = _by_name(job_families(jobs))
        assert fams["running_jobs"].values == {(): 1} and fams["finished_jobs"].values == {(): 2}
        assert fams["finished_jobs"].kind == "counter"

    def test_placement_group_latencies_observe_each_created_group_once(self) -> None:
        latencies = PlacementGroupLatencies()
        created = _pg(
            1, PG.CREATED, end_to_end_creation_latency_us=5_000, scheduling_latency_us=500
        )
        latencies.observe([created, _pg(2, PG.PENDING)])
        latencies.observe([created])
        creation, scheduling = latencies.families()
        assert creation.name == "gcs_placement_group_creation_latency_ms"
        assert creation.buckets == {(): (0, 0, 1, 0, 0, 0, 0)} and creation.sums == {(): 5.0}
        assert scheduling.buckets == {(): (0, 1, 0, 0, 0, 0, 0)}

    def test_store_latency_is_rebucketed_exactly_to_rays_bounds(self) -> None:
        async def run() -> MeteredStore:
            store = MeteredStore(MemoryStore(), CollectorRegistry())
            await store.put("KV", b"k", b"v")
            await store.get("KV", b"k")
            await store.get("KV", b"k")
            return store

        store = asyncio.run(run())
        fams = _by_name(store_families(store.latency_histograms()))
        counts = {
            dict(k)["Operation"]: v for k, v in fams["gcs_storage_operation_count"].values.items()
        }
        assert counts["Get"] == 2 and counts["Put"] >= 1
        latency = fams["gcs_storage_operation_latency_ms"]
        assert latency.bounds == LATENCY_BOUNDS_MS
        get = latency.buckets[(("Operation", "Get"),)]
        assert len(get) == len(LATENCY_BOUNDS_MS) + 1 and sum(get) == 2

    def test_rebucket_takes_differences_and_refuses_a_missing_bound(self) -> None:
        bounds = (0.0001, 0.0005, 0.001, 0.01)
        cumulative = (1.0, 3.0, 4.0, 6.0, 9.0)  # +Inf last
        assert rebucket(bounds, cumulative, [0.0001, 0.001, 0.01]) == (1, 3, 2, 3)
        with pytest.raises(ValueError, match="not one of"):
            rebucket(bounds, cumulative, [0.1])


class TestDeltaEncoder:
    def test_counters_and_histograms_send_what_changed_since_the_last_acknowledged(self) -> None:
        enc = DeltaEncoder(GLOBAL)
        enc.baseline([Family("finished_jobs", "", "counter", {(): 3.0})])  # loaded at start
        request, sent = enc.request([Family("finished_jobs", "", "counter", {(): 5.0})], 1)
        assert _points(request)["finished_jobs"] == [{**GLOBAL, "value": 2.0}]
        metric = _metric(request, "finished_jobs")
        assert metric.sum.is_monotonic
        assert metric.sum.aggregation_temporality == otlp.AGGREGATION_TEMPORALITY_DELTA
        # not acknowledged: the next request carries it as well
        request, sent = enc.request([Family("finished_jobs", "", "counter", {(): 6.0})], 2)
        assert _points(request)["finished_jobs"][0]["value"] == 3.0
        enc.commit(sent)
        request, _ = enc.request([Family("finished_jobs", "", "counter", {(): 6.0})], 3)
        assert "finished_jobs" not in _points(request)  # nothing new: no point

        hist = Family("h", "", "histogram", bounds=(1.0,), buckets={(): (1, 0)}, sums={(): 0.5})
        request, sent = enc.request([hist], 4)
        enc.commit(sent)
        hist.buckets[()] = (1, 2)
        hist.sums[()] = 10.5
        request, _ = enc.request([hist], 5)
        (point,) = _metric(request, "h").histogram.data_points
        assert list(point.bucket_counts) == [0, 2] and point.count == 2 and point.sum == 10.0
        assert list(point.explicit_bounds) == [1.0]

    def test_a_gauge_series_that_disappears_is_sent_once_more_as_zero(self) -> None:
        enc = DeltaEncoder(GLOBAL)
        alive = (("State", "ALIVE"),)
        dead = (("State", "DEAD"),)
        _req, sent = enc.request([Family("actors", "", "gauge", {alive: 1.0})], 1)
        enc.commit(sent)
        request, sent = enc.request([Family("actors", "", "gauge", {dead: 1.0})], 2)
        rows = sorted(_points(request)["actors"], key=lambda r: r["State"])
        assert [(r["State"], r["value"]) for r in rows] == [("ALIVE", 0.0), ("DEAD", 1.0)]
        enc.commit(sent)
        request, _ = enc.request([Family("actors", "", "gauge", {dead: 1.0})], 3)
        assert [r["State"] for r in _points(request)["actors"]] == ["DEAD"]


class _Agent:
    """Ray's agent's OTLP method, in process (the requests it got)."""

    def __init__(self) -> None:
        self.requests: list[otlp.ExportMetricsServiceRequest] = []
        self.refuse: grpc.StatusCode | None = None

    async def export(self, request, context):  # type: ignore[no-untyped-def]
        if self.refuse is not None:
            await context.abort(self.refuse, "refused")
        self.requests.append(request)
        return otlp.ExportMetricsServiceResponse()


@pytest.fixture
async def agent() -> AsyncIterator[tuple[_Agent, int]]:
    server = grpc.aio.server()
    servicer = _Agent()
    service, method = EXPORT_METHOD.strip("/").split("/")
    handler = grpc.unary_unary_rpc_method_handler(
        servicer.export,
        request_deserializer=otlp.ExportMetricsServiceRequest.FromString,
        response_serializer=otlp.ExportMetricsServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, port
    finally:
        await server.stop(None)


def test_our_otlp_subset_is_wire_identical_to_opentelemetry_proto() -> None:
    """Every field of gcs/proto/otlp_metrics.proto has OTLP's number, type and
    cardinality, and a request of ours parses as OTLP's with the same content."""
    official = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2")
    common = pytest.importorskip("opentelemetry.proto.common.v1.common_pb2")
    resource = pytest.importorskip("opentelemetry.proto.resource.v1.resource_pb2")
    service = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
    by_name = {
        **{n: getattr(official, n) for n in dir(official) if n[0].isupper()},
        **{n: getattr(common, n) for n in ("AnyValue", "KeyValue", "InstrumentationScope")},
        "Resource": resource.Resource,
        **{n: getattr(service, n) for n in dir(service) if n.startswith("Export")},
    }
    checked = 0
    for name, ours in otlp.DESCRIPTOR.message_types_by_name.items():
        theirs = by_name[name].DESCRIPTOR
        for field in ours.fields:
            other = theirs.fields_by_name[field.name]
            assert (field.number, field.type, field.is_repeated) == (
                other.number,
                other.type,
                other.is_repeated,
            ), f"{name}.{field.name}"
            checked += 1
    assert checked >= 50
    assert [v.number for v in otlp.AggregationTemporality.DESCRIPTOR.values] == [
        v.number for v in official.AggregationTemporality.DESCRIPTOR.values
    ]
    enc = DeltaEncoder(GLOBAL)
    hist = Family("h", "d", "histogram", bounds=(1.0,), buckets={(): (1, 2)}, sums={(): 3.5})
    gauge = Family("g", "d", "gauge", {(("State", "ALIVE"),): 2.0})
    request, _ = enc.request([hist, gauge], 7)
    parsed = service.ExportMetricsServiceRequest.FromString(request.SerializeToString())
    metrics = {m.name: m for m in parsed.resource_metrics[0].scope_metrics[0].metrics}
    (point,) = metrics["h"].histogram.data_points
    assert list(point.bucket_counts) == [1, 2] and point.sum == 3.5 and point.time_unix_nano == 7
    assert metrics["h"].histogram.aggregation_temporality == 1  # DELTA
    (value,) = metrics["g"].gauge.data_points
    assert value.as_double == 2.0
    assert {kv.key: kv.value.string_value for kv in value.attributes}["State"] == "ALIVE"


class TestExporter:
    async def test_exports_on_the_interval_and_carries_a_refused_export(
        self, agent: tuple[_Agent, int]
    ) -> None:
        servicer, port = agent
        clock = FakeClock()
        finished = {"n": 1.0}
        exporter = MetricsAgentExporter(
            target=lambda: f"127.0.0.1:{port}",
            snapshot=lambda: [Family("finished_jobs", "", "counter", {(): finished["n"]})],
            global_labels=GLOBAL,
            interval_ms=10,  # floored to Ray's 1000
            clock=clock,
            security=Security(),
        )
        await exporter.load()
        task = asyncio.create_task(exporter.run())
        try:
            finished["n"] = 3.0
            servicer.refuse = grpc.StatusCode.UNAVAILABLE
            await clock.advance_until(lambda: clock.monotonic_s() >= 1.0, 0.5)
            assert not servicer.requests and exporter.exports == 0  # not yet, then refused
            await clock.advance_until(
                lambda: exporter.exports == 0 and clock.monotonic_s() >= 2.5, 0.5
            )
            servicer.refuse = None
            await clock.advance_until(lambda: exporter.exports >= 1, 0.5)
            assert _points(servicer.requests[0])["finished_jobs"][0]["value"] == 2.0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await exporter.close()

    async def test_an_agent_without_otlp_ends_the_export(self, agent: tuple[_Agent, int]) -> None:
        servicer, port = agent
        servicer.refuse = grpc.StatusCode.UNIMPLEMENTED
        exporter = MetricsAgentExporter(
            target=lambda: f"127.0.0.1:{port}",
            snapshot=lambda: [],
            global_labels=GLOBAL,
            interval_ms=1000,
            clock=FakeClock(),
            security=Security(),
        )
        assert not await exporter.export_once()
        assert exporter.unsupported
        await exporter.run()  # returns at once
        await exporter.close()


def test_gcs_server_takes_rays_agent_port_node_address_and_knobs() -> None:
    import base64
    import json

    from gcs.cli.dropin.flags import GcsServerFlags
    from gcs.cli.dropin.main import build_config
    from gcs.cli.dropin.ray_config import map_config

    knobs = {"enable_metrics_collection": False, "metrics_report_interval_ms": 500}
    flags = GcsServerFlags(
        metrics_agent_port=0,
        node_ip_address="10.1.2.3",
        config_list=base64.b64encode(json.dumps(knobs).encode()).decode(),
    )
    cfg = build_config(flags, map_config(flags, {}), {})
    assert (cfg.metrics_agent_port, cfg.node_ip_address) == (0, "10.1.2.3")
    assert (cfg.enable_metrics_collection, cfg.metrics_report_interval_ms) == (False, 500)
    assert GcsServer(cfg).advertised_host == "10.1.2.3"


def test_the_config_takes_rays_knobs_and_refuses_a_bad_port() -> None:
    cfg = load_config(
        env={"RAY_metrics_report_interval_ms": "2500", "RAY_enable_metrics_collection": "0"},
        flags={"metrics_agent_port": 52000},
    )
    assert (cfg.metrics_agent_port, cfg.metrics_report_interval_ms) == (52000, 2500)
    assert cfg.enable_metrics_collection is False
    for bad in (70000, -2):
        with pytest.raises(ConfigError, match="metrics_agent_port"):
            load_config(env={}, flags={"metrics_agent_port": bad})


async def _start_server(clock: FakeClock, agent_port: int) -> GcsServer:
    config = GcsConfig(
        port=0,
        metrics_port=-1,
        storage="memory://",
        metrics_agent_port=agent_port,
        session_name="session_x",
    )
    server = GcsServer(config, clock=clock)
    await server.start()
    return server


async def test_the_server_exports_rays_families_to_the_agent_it_was_given(
    agent: tuple[_Agent, int],
) -> None:
    servicer, port = agent
    clock = FakeClock()
    server = await _start_server(clock, port)
    try:
        await clock.advance_until(lambda: bool(servicer.requests), 1.0)
    finally:
        await server.stop()
    points = _points(servicer.requests[0])
    assert {"placement_groups", "gcs_actors_count", "running_jobs"} <= set(points)
    (created,) = [p for p in points["placement_groups"] if p["State"] == "CREATED"]
    assert created["Component"] == "gcs_server" and created["Source"] == "gcs"
    assert created["SessionName"] == "session_x" and created["Version"] == "2.60.0"
    assert created["NodeAddress"] and created["WorkerId"] == ""


async def test_port_0_waits_for_the_head_node_to_register_its_agent(
    agent: tuple[_Agent, int],
) -> None:
    """Ray starts its GCS with ``--metrics-agent-port=0``: the agent starts later, with
    the head raylet, and the head node's registration carries its port."""
    servicer, port = agent
    clock = FakeClock()
    server = await _start_server(clock, 0)
    try:
        await clock.run_for(30.0, step_s=1.0)  # three export periods
        assert not servicer.requests  # no head node yet: nowhere to export
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            await ServiceStub(channel, svc.NODE_INFO, timeout_s=10).RegisterNode(
                G.RegisterNodeRequest(
                    node_info=gcs_pb2.GcsNodeInfo(
                        node_id=b"\x07" * 28,
                        node_manager_address="127.0.0.1",
                        node_manager_port=1,
                        is_head_node=True,
                        metrics_agent_port=port,
                        state=gcs_pb2.GcsNodeInfo.ALIVE,
                    )
                )
            )
        await clock.advance_until(lambda: bool(servicer.requests), 1.0)
    finally:
        await server.stop()
    assert "gcs_actors_count" in _points(servicer.requests[0])
