"""Prometheus metrics, on a registry the server owns (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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

    def on_call(self, method: str, code: str, seconds: float) -> None:
        self.rpc_total.labels(method, code).inc()
        self.rpc_seconds.labels(method).observe(seconds)

    def serve(self, host: str, port: int) -> int:
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def close(self) -> None:
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()
