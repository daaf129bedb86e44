"""Prometheus metrics, on a registry the server owns (no process-global state).

Two kinds of figures:

* pushed as they happen: RPC counts and latencies (``on_call``);
* read from their owners at scrape time (:meth:`GcsMetrics.add_source`): node counts,
  poll and health-check totals, virtual clusters, pubsub.  A figure that only grows is a
  counter (``*_total``), never a gauge, so ``rate()`` works across restarts.

The registry also carries the standard process (CPU, memory, fds), platform and Python GC
collectors, as ``prometheus_client``'s default registry would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from gcs.store import Store
from gcs.store.metered import MeteredStore

MetricSource = Callable[[], Iterable[Metric]]

__all__ = [
    "GcsMetrics",
    "MetricSource",
    "counter",
    "counters",
    "gauge",
    "on_loop",
    "pubsub_families",
]

SCRAPE_TIMEOUT_S = 5.0


def on_loop(loop: asyncio.AbstractEventLoop, source: MetricSource) -> MetricSource:
    """Run ``source`` on the event loop that owns the state it reads.

    The HTTP endpoint scrapes from its own thread; reading manager dicts there while the
    loop mutates them could fail mid-iteration, so the read is marshalled onto the loop
    (a busy or stopped loop yields nothing rather than blocking the scrape forever).
    """

    def collect() -> Iterable[Metric]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return list(source())
        result: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def call() -> None:
            try:
                result.set_result(list(source()))
            except BaseException as err:
                result.set_exception(err)

        try:
            loop.call_soon_threadsafe(call)
            return result.result(SCRAPE_TIMEOUT_S)
        except (RuntimeError, TimeoutError):  # loop closed, or too busy to answer
            return []

    return collect


def counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    """A counter family with one sample (``name`` without ``_total``; it is added)."""
    family = CounterMetricFamily(name, doc, labels=sorted(labels or {}))
    family.add_metric([v for _k, v in sorted((labels or {}).items())], value)
    return family


Samples = dict[tuple[str, ...], float] | float


def _fill(family: Metric, samples: Samples) -> Metric:
    if isinstance(samples, dict):
        for values, value in samples.items():
            family.add_metric(list(values), value)  # type: ignore[attr-defined]
    else:
        family.add_metric([], samples)  # type: ignore[attr-defined]
    return family


def gauge(name: str, doc: str, samples: Samples, *, labels: tuple[str, ...] = ()) -> Metric:
    """A gauge family: one value, or ``{label values: value}`` with ``labels`` names."""
    return _fill(GaugeMetricFamily(name, doc, labels=list(labels)), samples)


def counters(name: str, doc: str, samples: Samples, *, labels: tuple[str, ...] = ()) -> Metric:
    """A counter family (``name`` without ``_total``) with one sample per label set."""
    return _fill(CounterMetricFamily(name, doc, labels=list(labels)), samples)


_PUBSUB_METRICS = (
    ("gcs_pubsub_subscribers", "Pubsub subscribers", "subscribers", gauge),
    ("gcs_pubsub_held_polls", "Long polls held open", "held_polls", gauge),
    ("gcs_pubsub_queued_messages", "Messages waiting for an ack", "queued_messages", gauge),
    ("gcs_pubsub_held_messages", "Distinct messages held for subscribers", "held_messages", gauge),
    ("gcs_pubsub_held_bytes", "Bytes of messages held, each once", "held_bytes", gauge),
    ("gcs_pubsub_published", "Messages published", "last_sequence_id", counters),
    ("gcs_pubsub_dropped_messages", "Messages dropped over a limit", "dropped_messages", counters),
    ("gcs_pubsub_dropped_bytes", "Bytes of messages dropped", "dropped_bytes", counters),
    (
        "gcs_pubsub_dropped_subscribers",
        "Subscribers dropped as lagging",
        "dropped_subscribers",
        counters,
    ),
)


def pubsub_families(stats: Mapping[str, Any]) -> list[Metric]:
    """``gcs_pubsub_*`` families from each publisher's ``stats()``, by publisher name."""
    out = []
    for metric, doc, attr, kind in _PUBSUB_METRICS:
        values: dict[tuple[str, ...], float] = {
            (name,): float(getattr(ps, attr)) for name, ps in stats.items()
        }
        out.append(kind(metric, doc, values, labels=("publisher",)))  # type: ignore[operator]
    return out


class _Sources(Collector):
    def __init__(self) -> None:
        self.sources: list[MetricSource] = []

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source()


class GcsMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._sources = _Sources()
        self.registry.register(self._sources)
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
        self._http: object | None = None
        self.port = 0
        """The /metrics endpoint's port once served (0: not served)."""
        self._metered: MeteredStore | None = None
        self._call_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        """(method, code) -> metric children: ``labels()`` costs ~5 us, paid once here."""

    def metered(self, store: Store) -> MeteredStore:
        """``store`` counted in this registry's ``gcs_store_*`` metrics (created once: an
        HA member wraps each leader term's store)."""
        if self._metered is None:
            self._metered = MeteredStore(store, self.registry)
            return self._metered
        return self._metered.sharing(store)

    def add_source(self, source: MetricSource) -> None:
        """``source()`` is called at every scrape and yields metric families."""
        self._sources.sources.append(source)

    def remove_source(self, source: MetricSource) -> None:
        """Stop calling ``source`` (an HA leader's term ended: its managers are gone)."""
        if source in self._sources.sources:
            self._sources.sources.remove(source)

    def on_call(self, method: str, code: str, seconds: float) -> None:
        children = self._call_children.get((method, code))
        if children is None:
            children = self._call_children[(method, code)] = (
                self.rpc_total.labels(method, code),
                self.rpc_seconds.labels(method),
            )
        children[0].inc()
        children[1].observe(seconds)

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics endpoint; a busy port is an ``OSError`` that names it."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            reason = "already in use" if err.errno == errno.EADDRINUSE else err.strerror
            raise OSError(
                err.errno, f"cannot serve metrics on {host}:{port}: {reason or err}"
            ) from None
        self._http = server
        self.port = int(server.server_port)
        return self.port

    def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            http.shutdown()  # type: ignore[attr-defined]
            http.server_close()  # type: ignore[attr-defined]
