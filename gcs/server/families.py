"""The GCS's own metric families, read from the managers at scrape time.

Each figure comes from its owner's public read API (stats objects, counts, query
methods); :class:`~gcs.server.metrics.GcsMetrics` runs :func:`gcs_families` on the event
loop for every scrape (``on_loop``).  Pushed figures (RPCs, store operations) are not here.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from gcs.server.managers import Managers
from gcs.server.metrics import counter, counters, gauge, pubsub_families

__all__ = ["gcs_families"]


def gcs_families(m: Managers) -> list[Metric]:
    return [
        *_nodes_and_polls(m),
        *_syncer(m),
        gauge("gcs_task_events_stored", "Task attempts with events held", len(m.tasks)),
        gauge(
            "gcs_pending_resource_shapes",
            "Distinct pending resource shapes",
            len(m.resources.demand),
        ),
        gauge(
            "gcs_actors",
            "Actors by state (dead ones while cached)",
            {(state,): count for state, count in m.actors.count_by_state().items()},
            labels=("state",),
        ),
        gauge(
            "gcs_placement_groups",
            "Placement groups by state",
            {(state,): count for state, count in m.placement_groups.count_by_state().items()},
            labels=("state",),
        ),
        _jobs(m),
        *_virtual_clusters(m),
        *pubsub_families(
            {
                "control_plane": m.pubsub.control_plane.stats(),
                "observability": m.pubsub.observability.stats(),
            }
        ),
    ]


def _nodes_and_polls(m: Managers) -> list[Metric]:
    stats = m.poller.stats
    return [
        gauge(
            "gcs_nodes",
            "Nodes by state",
            {("ALIVE",): len(m.nodes.alive), ("DEAD",): len(m.nodes.dead)},
            labels=("state",),
        ),
        gauge(
            "gcs_load_poll_round_seconds",
            "Duration of the last load-poll round",
            stats.last_round_s,
        ),
        gauge(
            "gcs_load_poll_max_staleness_seconds",
            "Age of the oldest node resource report",
            stats.max_staleness_s,
        ),
        counter("gcs_load_poll_ok", "Successful GetResourceLoad calls", stats.polls_ok),
        counter("gcs_load_poll_failures", "Failed GetResourceLoad calls", stats.polls_failed),
        counter(
            "gcs_load_poll_skipped_synced",
            "Polls left out: unchanged syncer view, no pending demand (adaptive polling)",
            stats.skipped_synced,
        ),
        counter("gcs_health_check_failures", "Failed raylet health checks", m.health.failures),
        counter("gcs_health_checks", "Raylet health-check RPCs made", m.health.checks),
    ]


def _syncer(m: Managers) -> list[Metric]:
    stats = m.syncer.stats
    return [
        gauge("gcs_syncer_streams", "Raylets connected to the syncer", len(m.syncer.peers)),
        counters(
            "gcs_syncer_messages",
            "Syncer messages by outcome",
            {
                ("accepted",): stats.accepted,
                ("stale",): stats.stale,
                ("unknown_node",): stats.unknown_node,
                ("undecodable",): stats.undecodable,
                ("relayed",): stats.relayed,
                ("coalesced",): stats.coalesced,
            },
            labels=("outcome",),
        ),
    ]


def _jobs(m: Managers) -> Metric:
    running = finished = 0
    for job in m.jobs.all_jobs():
        if job.is_dead:
            finished += 1
        else:
            running += 1
    return gauge(
        "gcs_jobs",
        "Jobs by state (RUNNING, or FINISHED while the job table keeps them)",
        {("RUNNING",): running, ("FINISHED",): finished},
        labels=("state",),
    )


def _virtual_clusters(m: Managers) -> list[Metric]:
    """Counted as ``vcluster list`` counts (alive members, :func:`counted_members`); the
    dead members a cluster still lists until replenished are their own family."""
    registry = m.virtual_clusters.registry
    kinds: dict[tuple[str, ...], float] = {}
    for cluster in registry.clusters():
        kinds[(cluster.kind.name,)] = kinds.get((cluster.kind.name,), 0) + 1
    counts = registry.node_counts()
    return [
        gauge("gcs_virtual_clusters", "Virtual clusters by kind", kinds, labels=("kind",)),
        gauge(
            "gcs_virtual_cluster_nodes",
            "Alive nodes per virtual cluster (as `gcs vcluster list` counts them)",
            {(cid,): alive for cid, (alive, _dead) in counts.items()},
            labels=("virtual_cluster",),
        ),
        gauge(
            "gcs_virtual_cluster_dead_nodes",
            "Dead nodes a virtual cluster still lists until they are replenished",
            {(cid,): dead for cid, (_alive, dead) in counts.items()},
            labels=("virtual_cluster",),
        ),
    ]
