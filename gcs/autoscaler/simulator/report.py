"""The simulator's outputs: a summary (JSON + text) and a PNG timeline."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from gcs.autoscaler.simulator.run import SimResult
from gcs.autoscaler.simulator.timeline import plot_timeline


def summary(result: SimResult) -> dict[str, Any]:
    dt_h = result.interval_s / 3600
    workers = [sum(s.nodes_by_type.values()) - 1 for s in result.samples]  # minus the head
    lat = sorted(result.batch_latency_s)
    hours = len(result.samples) * dt_h
    by_kind: Counter[str] = Counter()
    for _t, _node_type, count, kind in result.failures:
        by_kind[kind] += count
    return {
        "simulated_hours": round(hours, 3),
        "time_to_capacity_s": {
            "p50": round(statistics.median(lat), 1) if lat else None,
            "max": round(lat[-1], 1) if lat else None,
            "unfinished_batches": result.unfinished_batches,
        },
        "node_hours": round(sum(max(w, 0) for w in workers) * dt_h, 2),
        "idle_node_hours": round(sum(s.idle_nodes for s in result.samples) * dt_h, 2),
        "pending_task_seconds": round(result.pending_task_s, 1),
        "tasks": {"total": result.tasks_total, "started": result.tasks_started},
        "peak_workers": max(workers, default=0),
        "launched": result.launched,
        "failed_launches": result.failed_launches,
        "failed_launches_per_day": round(result.failed_launches * 24 / hours, 1) if hours else 0,
        "failed_launches_by_cause": dict(sorted(by_kind.items())),
        "terminated": result.terminated,
        "failed_rounds": result.failed_rounds,
        "mean_utilisation": round(
            statistics.fmean(s.cpu_used / s.cpu_total for s in result.samples if s.cpu_total), 3
        )
        if any(s.cpu_total for s in result.samples)
        else 0.0,
    }


def summary_text(doc: dict[str, Any]) -> str:
    ttc = doc["time_to_capacity_s"]
    return "\n".join(
        [
            f"simulated            {doc['simulated_hours']} h",
            f"time to capacity     p50 {ttc['p50']} s, max {ttc['max']} s"
            f" ({ttc['unfinished_batches']} arrivals never fully started)",
            f"node-hours           {doc['node_hours']} (idle {doc['idle_node_hours']})",
            f"pending task-seconds {doc['pending_task_seconds']}",
            f"tasks                {doc['tasks']['started']} of {doc['tasks']['total']} started",
            f"peak workers         {doc['peak_workers']}",
            f"launches             {doc['launched']} ({doc['failed_launches']} failed: "
            + (", ".join(f"{n} {k}" for k, n in doc["failed_launches_by_cause"].items()) or "none")
            + f"; {doc['failed_launches_per_day']} per day), {doc['terminated']} terminated",
            f"mean utilisation     {doc['mean_utilisation'] * 100:.1f}% of CPU",
        ]
    )


def write_report(result: SimResult, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = summary(result)
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "summary.txt").write_text(summary_text(doc) + "\n")
    (out / "events.txt").write_text(
        "".join(f"{t / 3600:8.3f} h  {kind:<16} {msg}\n" for t, kind, msg in result.events)
    )
    png = out / "timeline.png"
    plot_timeline(result, png)
    return {"summary": out / "summary.json", "timeline": png, "events": out / "events.txt"}
