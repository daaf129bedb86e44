"""``--dist loadgroup`` as this suite means it: every test of one ``tests/interop`` module (or
of another module of :data:`GROUPED`) on one worker, every other test on its own (as
``--dist load`` spreads them), the longest first.

One worker per interop module starts the module's cluster once (its module-scoped fixtures
live there), and two clusters of a module never race for the same loopback addresses and
Ray's default ports.  pytest-xdist 3.8's own ``loadgroup`` groups by an ``xdist_group`` mark
that it writes into ``item._nodeid``, which pytest 9 no longer reads (node ids live in
``item._id``): under pytest 9 it grouped nothing, and each module's tests ran on all
workers, each worker starting the module's cluster again.  The scheduler sees node ids
only (the controller collects nothing), so the group is the module's path.

An interop module is the suite's critical path: its tests run in a row on one worker while
the ~2,900 others spread.  So the scopes are handed out longest first (:data:`COST_S`,
measured; LPT scheduling), and a test that starts a cluster of its own rather than the
module's (:data:`ALONE`) is a scope of its own, free to run beside its module.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from xdist.scheduler import LoadScopeScheduling

if TYPE_CHECKING:
    from xdist.workermanage import WorkerController

GROUPED = (
    "tests/interop/",
    # Module-scoped fixtures that start processes, elsewhere: as scopes of a test each, the
    # module's tests went to every worker, and each built the fixture again (the demo twice
    # in a run, ~5 CPU s each; PostgreSQL's initdb per worker).
    "tests/cli/test_readme.py",  # the demo cluster; Redis and PostgreSQL
    "tests/cli/test_observability.py",  # a GCS with its embedded autoscaler
    "tests/server/test_ha_process.py",  # PostgreSQL
    "tests/server/test_store_full.py",  # a Redis and a PostgreSQL of its own
    "tests/autoscaler/test_simulator_report.py",  # a simulated day, drawn by each test
)
"""Modules whose tests share a module-scoped cluster or server: each runs on one worker.
(Not ``tests/dropin``: its files share only a venv, prepared under a file lock, and run 2.5
min in a row on one worker.)"""

ALONE = (
    # each test starts its own cluster (restartable_cluster); the module shares none
    "tests/interop/test_gcs_restart_real_ray.py::",
    "tests/interop/test_gcs_restart_deaths_real_ray.py::",
)
"""Interop node ids (prefixes) that are scopes of their own: the test uses no module-scoped
cluster, so it may run on any worker beside the rest of its module."""

COST_S = {
    # seconds per scope in a measured run (scripts/test.sh says how); relative is enough
    "tests/interop/test_dashboard.py": 295,
    "tests/interop/test_state_api_parity.py": 185,
    "tests/interop/test_placement_groups_real_ray.py": 160,
    "tests/interop/test_gcs_restart_real_ray.py::": 70,
    "tests/interop/test_gcs_restart_deaths_real_ray.py::": 45,
    "tests/interop/test_real_cluster.py": 50,
    "tests/interop/test_ha_upgrade_real_ray.py": 90,
    "tests/interop/test_ha_handover_real_ray.py": 57,
    "tests/interop/test_ray_auth.py": 19,
    "tests/interop/test_request_resources_wire.py": 10,
    # single tests elsewhere that are long enough to end a run if started last
    "tests/autoscaler/test_simulator.py::test_skipping_is_exact_on_the_500_node": 110,
    "tests/interop/test_autoscaler_real_ray.py": 46,
    "tests/dropin/test_ray_suite_smoke.py::test_rays_own_tests_pass_on_gcs_server[test_get_or": 155,
    "tests/interop/test_ant_ray_vcluster.py": 33,
    "tests/dropin/test_ray_suite_smoke.py::test_rays_own_tests_pass_on_gcs_server[test_list": 81,
    "tests/cli/test_readme.py": 90,  # its TestQuickstart alone: 55
    "tests/server/test_fuzz.py::test_fuzz_every_unary_method": 48,
    "tests/autoscaler/test_reconciler_state_machine.py": 46,
    "tests/interop/test_actors_real_ray.py": 60,
    "tests/autoscaler/test_simulator.py": 30,
    "tests/autoscaler/aws/test_aws_end_to_end.py": 40,
    "tests/interop/test_actor_io_real_ray.py": 21,
}
"""Longest first: a scope's cost is the first entry its name starts with (an interop module's
path, or a test's node id); scopes named here go before the rest, which keep xdist's order
(most tests first).  A long scope missing here only starts later than it could.  Seconds of
the run measured on 2026-11-29 (at load ~20: only their order matters); the interop and
drop-in ones again that evening (``-n 2`` over tests/interop and tests/dropin alone, load
~15)."""


def cost(scope: str) -> float:
    return next((s for prefix, s in COST_S.items() if scope.startswith(prefix)), 0.0)


class InteropModuleScheduling(LoadScopeScheduling):
    """Scopes: a :data:`GROUPED` module's path (or an :data:`ALONE` test's node id), else
    the test's own node id; handed out by :func:`cost`, then by their number of tests."""

    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        if not path.startswith(GROUPED) or nodeid.startswith(ALONE):
            return nodeid
        return path

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self._ordered:  # the queue is complete at the first assignment
            self._ordered = True
            rank(self.workqueue)
        super()._assign_work_unit(node)


def rank(queue: MutableMapping[str, dict[str, bool]]) -> None:
    """``queue`` (scope -> its tests) reordered in place, by :func:`cost` longest first;
    ties keep their order."""
    ranked = sorted(queue.items(), key=lambda unit: -cost(unit[0]))
    queue.clear()
    queue.update(ranked)
