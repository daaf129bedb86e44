"""The autoscaler's Prometheus figures (``gcs_autoscaler_*``), read at scrape time.

The runtime hands :func:`families` to whoever serves metrics, through a narrow "register
this source" callable; the autoscaler itself never imports the server.  A figure that only
grows is a counter, so ``rate()`` works across restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["AutoscalerFigures", "MetricSource", "RegisterMetrics", "families"]

MetricSource = Callable[[], Iterable[Metric]]
RegisterMetrics = Callable[[MetricSource], None]
"""Registers a source that reads state owned by the event loop: the registrar must call it
on that loop (``gcs.server.metrics.on_loop`` does)."""


@dataclass(frozen=True, slots=True)
class AutoscalerFigures:
    instances_by_status: Mapping[str, int]
    rounds: int
    failed_rounds: int
    launched_nodes: int
    terminated_nodes: int
    events_by_kind: Mapping[str, int]
    invalid_updates: int
    failed_launches_by_cause: Mapping[str, int]
    held_back_node_types: tuple[str, ...]
    #: Waiting requests by (reason, virtual cluster) as of the last round.
    waiting_requests: Mapping[tuple[str, str], int] = field(default_factory=dict)


def _counter(name: str, doc: str, value: float) -> Metric:
    family = CounterMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def families(f: AutoscalerFigures) -> list[Metric]:
    instances = GaugeMetricFamily(
        "gcs_autoscaler_instances", "Autoscaler instances by status", labels=["status"]
    )
    for status, n in sorted(f.instances_by_status.items()):
        instances.add_metric([status], float(n))
    events = CounterMetricFamily(
        "gcs_autoscaler_events",
        "Autoscaler events by kind (launch, drain, drain-rejected, release, ...)",
        labels=["kind"],
    )
    for kind, n in sorted(f.events_by_kind.items()):
        events.add_metric([kind], float(n))
    failed = CounterMetricFamily(
        "gcs_autoscaler_failed_launches",
        "Instances whose launch failed, by cause (capacity, quota, error)",
        labels=["cause"],
    )
    for cause, n in sorted(f.failed_launches_by_cause.items()):
        failed.add_metric([cause], float(n))
    held = GaugeMetricFamily(
        "gcs_autoscaler_held_back_node_types",
        "Node types held back after the cloud refused them (1 while held)",
        labels=["node_type"],
    )
    for node_type in sorted(f.held_back_node_types):
        held.add_metric([node_type], 1.0)
    waiting = GaugeMetricFamily(
        "gcs_autoscaler_waiting_requests",
        "Pending requests the last round could not run now, by why they wait (infeasible: "
        "no node type fits; capped: a limit stops the launch; pending-capacity: a node is "
        "being added) and virtual cluster ('' = cluster-wide)",
        labels=["reason", "virtual_cluster"],
    )
    for (reason, cluster), n in sorted(f.waiting_requests.items()):
        waiting.add_metric([reason, cluster], float(n))
    return [
        instances,
        _counter("gcs_autoscaler_rounds", "Reconcile rounds run", f.rounds),
        _counter(
            "gcs_autoscaler_failed_rounds",
            "Reconcile rounds aborted (provider, GCS or storage failure)",
            f.failed_rounds,
        ),
        _counter(
            "gcs_autoscaler_launched_nodes",
            "Nodes the provider accepted to launch",
            f.launched_nodes,
        ),
        _counter(
            "gcs_autoscaler_terminated_nodes", "Nodes the provider terminated", f.terminated_nodes
        ),
        events,
        _counter(
            "gcs_autoscaler_invalid_updates",
            "Instance updates the lifecycle table rejected",
            f.invalid_updates,
        ),
        failed,
        held,
        waiting,
    ]
