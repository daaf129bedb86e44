"""``--dist loadgroup`` as this suite means it: every test of one ``tests/interop`` module on
one worker, every other test on its own (as ``--dist load`` spreads them).

One worker per interop module starts the module's cluster once (its module-scoped fixtures
live there), and two clusters of a module never race for the same loopback addresses and
Ray's default ports.  pytest-xdist 3.8's own ``loadgroup`` groups by an ``xdist_group`` mark
that it writes into ``item._nodeid``, which pytest 9 no longer reads (node ids live in
``item._id``): under pytest 9 it grouped nothing, and each module's tests ran on all
workers, each worker starting the module's cluster again.  The scheduler sees node ids
only (the controller collects nothing), so the group is the module's path.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

GROUPED = ("tests/interop/",)
"""Modules whose tests share a module-scoped cluster: each runs on one worker.  (Not
``tests/dropin``: its files share only a venv, prepared under a file lock, and run 2.5 min
in a row on one worker.)"""


class InteropModuleScheduling(LoadScopeScheduling):
    """Scopes: an interop module's path, else the test's own node id.  xdist orders scopes
    by their number of tests (``--loadscope-reorder``): the interop modules, the long ones,
    start first."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return path if path.startswith(GROUPED) else nodeid
