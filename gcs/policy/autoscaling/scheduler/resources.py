"""Resource arithmetic and label matching, exactly as Ray 2.60 compares them (plain floats)."""

from __future__ import annotations

from collections.abc import Mapping

from gcs.policy.autoscaling.scheduler.types import (
    IMPLICIT_RESOURCE_PREFIX,
    LabelOp,
    LabelSelector,
    ResourceDemand,
)


def default_available(name: str) -> float:
    """What a node has of a resource it does not list: implicit resources count as 1."""
    return 1.0 if name.startswith(IMPLICIT_RESOURCE_PREFIX) else 0.0


def selector_matches(labels: Mapping[str, str], selector: LabelSelector) -> bool:
    for c in selector:
        value = labels.get(c.key)
        if c.op is LabelOp.IN:
            if value not in c.values:
                return False
        elif c.op is LabelOp.NOT_IN:
            if value in c.values:
                return False
        elif c.op is LabelOp.EXISTS:
            if value is None:
                return False
        elif c.op is LabelOp.DOES_NOT_EXIST:
            if value is not None:
                return False
        else:  # pragma: no cover - enum is closed
            return False
    return True


def label_score(labels: Mapping[str, str], selectors: tuple[LabelSelector, ...]) -> int:
    """``len(selectors) - i`` for the first selector ``i`` the labels satisfy, else 0."""
    for i, selector in enumerate(selectors):
        if selector_matches(labels, selector):
            return len(selectors) - i
    return 0


def _is_int(x: float) -> bool:
    return x == int(x) and abs(x) < 2**52


def fit_count(avail: Mapping[str, float], resources: Mapping[str, float], limit: int) -> int:
    """How many copies of ``resources`` Ray's one-at-a-time loop would place (<= limit).

    Integral amounts are exact in floats, so division gives the answer; otherwise we
    replay Ray's repeated subtraction so rounding ends the same way.
    """
    n = limit
    for name, v in resources.items():
        if v <= 0:
            if v < 0:
                return 0
            continue
        a = avail.get(name, default_available(name))
        if v > a:
            return 0
        if _is_int(v) and _is_int(a):
            n = min(n, int(a // v))
        else:
            k, x = 0, a
            while k < n and v <= x:
                x -= v
                k += 1
            n = k
        if n == 0:
            return 0
    return n


def subtract(avail: dict[str, float], resources: Mapping[str, float], times: int) -> None:
    """Take ``times`` copies of ``resources`` out of ``avail`` (one at a time if fractional)."""
    for name, v in resources.items():
        if v == 0:
            continue
        a = avail.get(name, default_available(name))
        if _is_int(v) and _is_int(a):
            a -= v * times
        else:
            for _ in range(times):
                a -= v
        avail[name] = a


def demand_sort_key(d: ResourceDemand) -> tuple:
    """Ray's request order key (used descending): constraints, selector size, shape."""
    return (
        1 if (d.affinity or d.anti_affinity) else 0,
        len(d.selectors[0]) if d.selectors else 0,
        len(d.resources),
        sum(d.resources.values()),
        sorted(d.resources.items()),
    )


def positive_shape(resources: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((k, v) for k, v in resources.items() if v > 0))


def fits_shape(avail: Mapping[str, float], shape: tuple[tuple[str, float], ...]) -> bool:
    return all(avail.get(k, default_available(k)) >= v for k, v in shape)


def shape_text(resources: Mapping[str, float]) -> str:
    """``{CPU:1, GPU:2, memory:2.00GiB}``: a resource map as the reasons print it (memory in
    Ray's units, :mod:`gcs.base.units`)."""
    from gcs.base.units import format_quantity

    return (
        "{" + ", ".join(f"{k}:{format_quantity(k, v)}" for k, v in sorted(resources.items())) + "}"
    )


def memory_text(value: float) -> str:
    """Bytes as a Kubernetes-style quantity when whole GiB/MiB, else plain."""
    for unit, size in (("Gi", 2**30), ("Mi", 2**20)):
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    return f"{value:g}"
