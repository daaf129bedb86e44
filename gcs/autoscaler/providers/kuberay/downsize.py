"""Beyond Ray: when a resized pod's extra capacity is given back (pure).

A pod of a group with ``"downsize": true`` whose logical CPU/memory beyond its template size
has stayed unused for the idle timeout is resized down to what is in use, never below the
template size.  GPUs and other resources are never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gcs.policy.autoscaling.scheduler.types import IpprSpec, IpprStatus


@dataclass(frozen=True)
class Downsize:
    cpu: float
    memory: float


def downsize_target(
    st: IpprStatus,
    spec: IpprSpec,
    total: Mapping[str, float],
    available: Mapping[str, float],
) -> Downsize | None:
    """The smaller size this pod could have now, or None (nothing unused, or busy resizing)."""
    if st.is_in_progress() or st.k8s_resize_status is not None:
        return None
    used_cpu = total.get("CPU", 0.0) - available.get("CPU", 0.0)
    used_mem = total.get("memory", 0.0) - available.get("memory", 0.0)
    cpu = min(st.current_cpu, max(spec.min_cpu, used_cpu))
    mem = min(st.current_memory, max(spec.min_memory, float(int(used_mem))))
    if cpu < st.current_cpu or mem < st.current_memory:
        return Downsize(cpu, mem)
    return None


class UnusedClock:
    """Since when each pod has had capacity to give back (forgotten as soon as it has none)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def due(self, pod: str, target: Downsize | None, now_s: float, idle_timeout_s: float) -> bool:
        if target is None:
            self._since.pop(pod, None)
            return False
        since = self._since.setdefault(pod, now_s)
        return now_s - since >= idle_timeout_s

    def reset(self, pod: str) -> None:
        self._since.pop(pod, None)

    def keep_only(self, pods: set[str]) -> None:
        for pod in [p for p in self._since if p not in pods]:
            del self._since[pod]
