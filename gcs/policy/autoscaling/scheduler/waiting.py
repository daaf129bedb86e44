"""Why demand waits: the one verdict ``gcs status``, ``plan``, ``submit``, events and metrics
read (pure: values in, values out).

Ray's autoscaler v2 lists every request its packer could not place as *infeasible*, the
ones a node-type limit stopped included (``max_workers``, ``max_num_nodes``); that list goes
on the wire unchanged (``AutoscalingState.infeasible_*``).  People and our own tools need
the finer answer, so each piece of waiting demand gets one :class:`WaitReason`:

* ``INFEASIBLE`` -- no node type can ever hold it (resources or label selectors): it waits
  until the cluster config changes; ``gcs submit`` withdraws such tasks.
* ``CAPPED`` -- a node type fits, but a limit stops the launch (the type's max_workers, the
  cluster's max_num_nodes, a virtual cluster's max): it runs when capacity frees, so it
  is kept.
* ``PENDING_CAPACITY`` -- it is placed on a node being added, or waits for a node type
  the cloud refused a moment ago (tried again after the back-off).

Each verdict names the virtual cluster whose scaling handles it (``cluster_id``; "" = the
cluster-wide pool): demand belongs to a virtual cluster only when its job says so (the GCS
attributes it, see ``VirtualClusterManager``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from gcs.policy.autoscaling.scheduler.explain import explain_unplaced
from gcs.policy.autoscaling.scheduler.resources import selector_matches, shape_text
from gcs.policy.autoscaling.scheduler.types import (
    LabelSelector,
    NodeTypeConfig,
    ResourceDemand,
    WaitingDemand,
    WaitKind,
    WaitReason,
)

__all__ = [
    "WaitKind",
    "WaitReason",
    "WaitingDemand",
    "counts",
    "fitting_types",
    "from_json",
    "gang_verdict",
    "in_cluster",
    "shape_key",
    "to_json",
    "unplaced_verdict",
    "verdict_for",
]


def _type_fits(
    cfg: NodeTypeConfig, resources: Mapping[str, float], selectors: Sequence[LabelSelector]
) -> bool:
    if any(cfg.resources.get(k, 0.0) < v for k, v in resources.items() if v > 0):
        return False
    return not selectors or any(selector_matches(cfg.labels, s) for s in selectors)


def fitting_types(
    resources: Mapping[str, float],
    selectors: Sequence[LabelSelector],
    configs: Mapping[str, NodeTypeConfig],
) -> list[str]:
    """Node types (config order) one node of which could hold one such request."""
    return [t for t, cfg in configs.items() if _type_fits(cfg, resources, selectors)]


def unplaced_verdict(
    demand: ResourceDemand,
    count: int,
    configs: Mapping[str, NodeTypeConfig],
    limited: Mapping[str, str],
    unavailable: Mapping[str, str],
    cluster_full: str | None,
) -> tuple[WaitReason, str]:
    """Why ``count`` requests of ``demand`` got no node this round.

    ``limited``: node type -> why a limit stops its launch ("is at max_workers 1");
    ``unavailable``: node type -> why the cloud holds it back; ``cluster_full``: why the
    cluster cap stops every launch, or None."""
    fits = fitting_types(demand.resources, demand.selectors, configs)
    excluded = {**limited, **unavailable}
    why = explain_unplaced(demand.resources, count, configs, excluded, cluster_full)
    if not fits:
        if not fitting_types(demand.resources, (), configs):
            return WaitReason.INFEASIBLE, why
        head = f"{count} pending {shape_text(demand.resources)} requests"
        return WaitReason.INFEASIBLE, (
            f"{head} fit no node type: no type that has the resources matches their label "
            "selectors; change the request or add a type"
        )
    if cluster_full is not None or any(t in limited for t in fits):
        return WaitReason.CAPPED, why
    if any(t in unavailable for t in fits):
        return WaitReason.PENDING_CAPACITY, why
    return WaitReason.INFEASIBLE, why


def gang_verdict(
    shapes: Iterable[ResourceDemand],
    fits_without_limits: bool,
    limited: Mapping[str, str],
    unavailable: Mapping[str, str],
    cluster_full: str | None,
) -> tuple[WaitReason, str]:
    """A placement group or constraint that could not be placed whole.  Infeasible unless
    it would be placed with no limit on any node type and the cluster
    (``fits_without_limits``, the packer's answer); then capped by the limits, or waiting
    for a type the cloud holds back.  ``shapes``: its (STRICT_PACK-combined) bundles."""
    if not fits_without_limits:
        big = [shape_text(d.resources) for d in shapes]
        return WaitReason.INFEASIBLE, (
            f"no set of node types can hold its bundles ({', '.join(big)}) together, even "
            "without node limits (resources, strategy or label selectors); change the "
            "request or add a type"
        )
    why = [f"{t} {w}" for t, w in limited.items()]
    if cluster_full is not None:
        why.append(f"cluster {cluster_full}")
    if unavailable and not why:
        what = "; ".join(f"{t} {w}" for t, w in unavailable.items())
        return WaitReason.PENDING_CAPACITY, f"cannot be placed whole now: {what}"
    if not why:
        why = ["it needs more nodes than the node types' max_workers or max_num_nodes allow"]
    return WaitReason.CAPPED, "cannot be placed whole now: " + "; ".join(why)


def in_cluster(items: Iterable[WaitingDemand], cluster_id: str) -> tuple[WaitingDemand, ...]:
    """``items`` attributed to virtual cluster ``cluster_id``."""
    return tuple(replace(w, cluster_id=cluster_id) for w in items)


def counts(items: Iterable[WaitingDemand]) -> Counter[tuple[str, str]]:
    """Waiting requests by (reason, virtual cluster) -- what the metric exports."""
    out: Counter[tuple[str, str]] = Counter()
    for w in items:
        out[(w.reason.value, w.cluster_id)] += w.count
    return out


def to_json(items: Iterable[WaitingDemand], *, at_s: float) -> bytes:
    """The document the autoscaler publishes (``gcs status`` and ``gcs submit`` read it)."""
    return json.dumps({"t": at_s, "waiting": [w.to_json() for w in items]}).encode()


def from_json(raw: bytes) -> tuple[WaitingDemand, ...]:
    """The entries of a published document; ``ValueError`` if it is not one."""
    try:
        doc = json.loads(raw)
        return tuple(WaitingDemand.from_json(e) for e in doc["waiting"])
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise ValueError(f"not a waiting-demand document: {err}") from None


def shape_key(resources: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """A resource shape compared as Ray does: zero amounts do not count."""
    return tuple(sorted((k, float(v)) for k, v in resources.items() if v > 0))


def verdict_for(
    items: Iterable[WaitingDemand], resources: Mapping[str, float], cluster_id: str = ""
) -> WaitReason | None:
    """The verdict on tasks of ``resources`` submitted for ``cluster_id`` ("" = none):
    INFEASIBLE only when every entry for that shape there says so."""
    wanted = shape_key(resources)
    reasons = {
        w.reason
        for w in items
        if w.kind is WaitKind.TASKS
        and w.cluster_id == cluster_id
        and shape_key(w.resources) == wanted
    }
    if not reasons:
        return None
    if reasons == {WaitReason.INFEASIBLE}:
        return WaitReason.INFEASIBLE
    return WaitReason.CAPPED if WaitReason.CAPPED in reasons else WaitReason.PENDING_CAPACITY
