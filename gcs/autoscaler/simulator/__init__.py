"""``gcs autoscaler simulate``: the real reconciler and scheduler on a virtual clock against
a simulated cloud and workload, with a timeline picture and a summary."""

from gcs.autoscaler.simulator.report import summary, write_report
from gcs.autoscaler.simulator.run import SimResult, simulate
from gcs.autoscaler.simulator.workload import Workload, WorkloadError, load_workload, parse_workload

__all__ = [
    "SimResult",
    "Workload",
    "WorkloadError",
    "load_workload",
    "parse_workload",
    "simulate",
    "summary",
    "write_report",
]
