"""Ray 2.60's node score: a tuple compared in order, higher is better.

(label score, GPU avoided, matching resource types, min util, mean util) where each
utilisation term is ``v * util**3`` for a total resource ``v`` (weighted by amount).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gcs.policy.autoscaling.scheduler.resources import label_score
from gcs.policy.autoscaling.scheduler.types import ResourceDemand

Score = tuple[int, bool, int, float, float]


def compute_score(
    total: Mapping[str, float],
    avail: Mapping[str, float],
    labels: Mapping[str, str],
    placed: Sequence[ResourceDemand],
    conserve_gpu: bool,
) -> Score:
    labels_ok = 0
    for d in placed:
        if d.selectors:
            labels_ok = label_score(labels, d.selectors)
            if labels_ok:
                break
    names: set[str] = set()
    any_gpu = False
    for d in placed:
        for k, v in d.resources.items():
            if v > 0:
                names.add(k)
            if k == "GPU":
                any_gpu = True
    matching = sum(1 for k in names if k in total)
    terms = []
    for k, v in total.items():
        if v == 0 or k not in avail:
            continue
        util = (v - avail[k]) / v
        terms.append(v * util**3)
    gpu_ok = not (conserve_gpu and total.get("GPU", 0) > 0 and not any_gpu)
    return (
        labels_ok,
        gpu_ok,
        matching,
        min(terms) if terms else 0,
        float(sum(terms)) / len(terms) if terms else 0,
    )
