"""The simulator's timeline picture, meant to be read at a glance.

Top to bottom, on one time axis (hours):

* worker nodes per type, each with its own limit drawn in its colour (the lower of the
  type's ``max_workers`` and the cloud's capacity for it), the cluster's ``max_workers`` as a
  dotted line and launches still pending as a dashed one; the head is left out (it is always
  there, and stacking it made the total jump);
* one panel per resource kind (CPU, GPU, memory, ...): what the alive nodes have, what is
  used, what waiting tasks ask for on top, and the most the config and the cloud allow;
* every failed launch, one row per node type (x: the cloud had no capacity or quota, o:
  any other error).

Legends sit outside the plotting area, to the right, so they never cover data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gcs.autoscaler.simulator.run import SimResult
from gcs.base.units import MEMORY_RESOURCES

_GIB = 2**30
_HELD_BACK = ("capacity", "quota")


def resource_kinds(result: SimResult) -> list[str]:
    """Resource kinds any node type offers, CPU and GPU first."""
    kinds = {
        k
        for res in result.type_resources.values()
        for k, v in res.items()
        if v > 0 and not k.startswith("node:")
    }
    first = [k for k in ("CPU", "GPU", "memory") if k in kinds]
    return first + sorted(kinds - set(first))


def type_limits(result: SimResult) -> dict[str, tuple[int, str]]:
    """Worker type -> (most nodes of it, what sets that limit)."""
    out = {}
    for t, most in result.type_max_workers.items():
        cap = result.cloud_capacity.get(t)
        if cap is not None and cap < most:
            out[t] = (cap, "cloud capacity")
        else:
            out[t] = (most, "max_workers")
    return out


def resource_ceiling(result: SimResult, kind: str) -> float:
    """The most of ``kind`` the workers can ever have: each type at its limit, the types
    richest in ``kind`` first, within the cluster's max_workers; plus the head's."""
    limits = type_limits(result)
    order = sorted(limits, key=lambda t: result.type_resources[t].get(kind, 0.0), reverse=True)
    room = (
        result.max_workers if result.max_workers is not None else sum(n for n, _ in limits.values())
    )
    total = result.type_resources.get(result.head_type, {}).get(kind, 0.0)
    for t in order:
        n = min(limits[t][0], room)
        total += n * result.type_resources[t].get(kind, 0.0)
        room -= n
    return total


def _scale(kind: str) -> tuple[float, str]:
    return (1 / _GIB, f"{kind} (GiB)") if kind in MEMORY_RESOURCES else (1.0, kind)


def _legend(ax: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _nodes_panel(ax: Any, result: SimResult, t: Sequence[float], colors: Mapping[str, Any]) -> None:
    workers = [
        sum(n for k, n in s.nodes_by_type.items() if k != result.head_type) for s in result.samples
    ]
    ax.fill_between(t, workers, step="post", color="0.88", label="all workers")
    for name, (limit, what) in type_limits(result).items():
        counts = [s.nodes_by_type.get(name, 0) for s in result.samples]
        ax.step(t, counts, where="post", color=colors[name], lw=1.4, label=name)
        ax.axhline(
            limit, color=colors[name], ls="--", lw=0.9, label=f"{name} limit {limit} ({what})"
        )
    if result.max_workers is not None:
        ax.axhline(
            result.max_workers,
            color="black",
            ls=":",
            lw=1,
            label=f"cluster max_workers {result.max_workers}",
        )
    pending = [s.pending_instances for s in result.samples]
    ax.step(t, pending, where="post", color="black", ls="-.", lw=0.8, label="launches pending")
    ax.set_ylabel("worker nodes")
    ax.set_title("Worker nodes by type (the head is not counted)", fontsize=10, loc="left")
    _legend(ax)


def _resource_panel(ax: Any, result: SimResult, t: Sequence[float], kind: str) -> None:
    factor, label = _scale(kind)
    total = [s.total.get(kind, 0.0) * factor for s in result.samples]
    used = [s.used.get(kind, 0.0) * factor for s in result.samples]
    wanted = [
        u + s.demand.get(kind, 0.0) * factor for u, s in zip(used, result.samples, strict=True)
    ]
    ax.fill_between(
        t,
        used,
        wanted,
        step="post",
        color="tab:orange",
        alpha=0.45,
        lw=0,
        label="asked by waiting tasks",
    )
    ax.fill_between(t, used, step="post", color="tab:blue", alpha=0.7, lw=0, label="used")
    ax.step(t, total, where="post", color="tab:blue", lw=1, label="on alive nodes")
    ceiling = resource_ceiling(result, kind) * factor
    ax.axhline(
        ceiling, color="tab:red", ls="--", lw=1, label=f"most config + cloud allow ({ceiling:g})"
    )
    ax.set_ylabel(label)
    ax.set_title(f"{kind}: capacity, use and waiting demand", fontsize=10, loc="left")
    _legend(ax)


def _failures_panel(ax: Any, result: SimResult, colors: Mapping[str, Any]) -> None:
    from matplotlib.lines import Line2D

    types = sorted(result.type_max_workers)
    rows = {name: i for i, name in enumerate(types)}
    held = [f for f in result.failures if f[3] in _HELD_BACK]
    other = [f for f in result.failures if f[3] not in _HELD_BACK]
    handles = []
    for failures, marker, label in (
        (held, "x", "no capacity / quota"),
        (other, "o", "other launch error"),
    ):
        if failures:
            ax.scatter(
                [f[0] / 3600 for f in failures],
                [rows.get(f[1], -1) for f in failures],
                marker=marker,
                s=28,
                c=[colors.get(f[1], "black") for f in failures],
            )
            handles.append(Line2D([], [], ls="", marker=marker, color="black", label=label))
    ax.set_yticks(range(len(types)), types)
    total = sum(f[2] for f in result.failures)
    ax.set_title(f"Failed launches ({total} instances)", fontsize=10, loc="left")
    ax.set_xlabel("hours")
    if handles:
        ax.legend(
            handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
        )


def build_figure(result: SimResult) -> Any:
    """The timeline as a matplotlib figure (Agg backend; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s / 3600 for s in result.samples]
    kinds = resource_kinds(result)
    workers = sorted(result.type_max_workers)
    palette = plt.get_cmap("tab10")
    colors = {name: palette(i % 10) for i, name in enumerate(workers)}
    heights = [3.0] + [2.2] * len(kinds) + [0.5 + 0.35 * max(1, len(workers))]
    fig, axes = plt.subplots(
        len(heights), 1, figsize=(13, sum(heights) + 1), sharex=True,
        gridspec_kw={"height_ratios": heights},
    )  # fmt: skip
    _nodes_panel(axes[0], result, t, colors)
    for ax, kind in zip(axes[1:-1], kinds, strict=True):
        _resource_panel(ax, result, t, kind)
    _failures_panel(axes[-1], result, colors)
    for ax in axes[:-1]:
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_ylim(bottom=min(0, ax.get_ylim()[0]))
    axes[-1].grid(axis="x", color="0.9", lw=0.6)
    axes[-1].set_ylim(-0.6, max(1, len(workers)) - 0.4)
    fig.subplots_adjust(left=0.07, right=0.74, top=0.97, bottom=0.06, hspace=0.35)
    return fig


def plot_timeline(result: SimResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = build_figure(result)
    fig.savefig(path, dpi=100)
    plt.close(fig)
