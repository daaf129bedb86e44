"""Prometheus metrics, on a registry the server owns (no process-global state)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gcs.pubsub.publisher import Publisher


class GcsMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpc_total = Counter(
            "gcs_rpc_total", "RPCs served", ["method", "code"], registry=self.registry
        )
        self.rpc_seconds = Histogram(
            "gcs_rpc_seconds",
            "RPC handler latency",
            ["method"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
            registry=self.registry,
        )
        self.nodes = Gauge("gcs_nodes", "Nodes by state", ["state"], registry=self.registry)
        self.poll_round_seconds = Gauge(
            "gcs_load_poll_round_seconds",
            "Duration of the last load-poll round",
            registry=self.registry,
        )
        self.poll_staleness_seconds = Gauge(
            "gcs_load_poll_max_staleness_seconds",
            "Age of the oldest node resource report",
            registry=self.registry,
        )
        self.poll_failures = Gauge(
            "gcs_load_poll_failures",
            "Failed GetResourceLoad calls since start",
            registry=self.registry,
        )
        self.poll_ok = Gauge(
            "gcs_load_poll_ok_total",
            "Successful GetResourceLoad calls since start",
            registry=self.registry,
        )
        self.health_failures = Gauge(
            "gcs_health_check_failures",
            "Failed health checks since start",
            registry=self.registry,
        )
        self.pending_shapes = Gauge(
            "gcs_pending_resource_shapes",
            "Distinct pending resource shapes",
            registry=self.registry,
        )

        self._call_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        """(method, code) -> metric children: ``labels()`` costs ~5 us, paid once here."""

    def on_call(self, method: str, code: str, seconds: float) -> None:
        children = self._call_children.get((method, code))
        if children is None:
            children = self._call_children[(method, code)] = (
                self.rpc_total.labels(method, code),
                self.rpc_seconds.labels(method),
            )
        children[0].inc()
        children[1].observe(seconds)

    def track_pubsub(self, publishers: Iterable[Publisher]) -> None:
        """Export each publisher's held bytes and drop counters, read at scrape time."""
        previous = getattr(self, "_pubsub_collector", None)
        if previous is not None:  # a restarted server tracks its new publishers
            self.registry.unregister(previous)
        self._pubsub_collector = _PubSubCollector(tuple(publishers))
        self.registry.register(self._pubsub_collector)

    def serve(self, host: str, port: int) -> int:
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def close(self) -> None:
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()


class _PubSubCollector(Collector):
    """``gcs_pubsub_*`` series per publisher, from the counters it keeps itself."""

    def __init__(self, publishers: tuple[Publisher, ...]) -> None:
        self._publishers = publishers

    def collect(self) -> Iterator[Any]:
        held = GaugeMetricFamily(
            "gcs_pubsub_held_bytes", "Bytes of messages held for subscribers", labels=["publisher"]
        )
        held_messages = GaugeMetricFamily(
            "gcs_pubsub_held_messages", "Messages held for subscribers", labels=["publisher"]
        )
        dropped = CounterMetricFamily(
            "gcs_pubsub_dropped_messages", "Messages dropped by a cap", labels=["publisher"]
        )
        dropped_bytes = CounterMetricFamily(
            "gcs_pubsub_dropped_bytes", "Bytes of messages dropped by a cap", labels=["publisher"]
        )
        dropped_subs = CounterMetricFamily(
            "gcs_pubsub_dropped_subscribers",
            "Subscribers dropped for lagging",
            labels=["publisher"],
        )
        for pub in self._publishers:
            name = [pub.config.name]
            held.add_metric(name, pub.held_bytes)
            held_messages.add_metric(name, pub.held_messages)
            dropped.add_metric(name, pub.dropped_messages)
            dropped_bytes.add_metric(name, pub.dropped_bytes)
            dropped_subs.add_metric(name, pub.dropped_subscribers)
        yield from (held, held_messages, dropped, dropped_bytes, dropped_subs)
