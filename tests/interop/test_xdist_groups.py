"""``--dist loadgroup`` (scripts/test.sh) keeps an interop module's tests on one worker and
spreads the rest (:mod:`tests.interop.xdist_groups`): a real ``pytest -n 2`` run shows where
each test ran."""

from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys

import pytest

from tests.interop.xdist_groups import InteropModuleScheduling, rank

ROOT = pathlib.Path(__file__).resolve().parents[2]
INTEROP_MODULE = "tests/interop/test_venvs.py"
INTEROP_TESTS = f"{INTEROP_MODULE}::TestRunInVenv"
OTHER_MODULE = "tests/unit/test_hermetic.py"
RAN = re.compile(r"^\[(gw\d+)\] .*?PASSED (\S+?)::", re.MULTILINE)


@pytest.mark.slow
def test_loadgroup_runs_an_interop_module_on_one_worker_and_spreads_the_rest() -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2",
            "--dist", "loadgroup", INTEROP_TESTS, OTHER_MODULE,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = collections.defaultdict(list)
    for worker, path in RAN.findall(done.stdout):
        workers[path].append(worker)
    interop, other = workers[INTEROP_MODULE], workers[OTHER_MODULE]
    assert len(interop) == 3 and len(set(interop)) == 1, done.stdout
    assert len(other) >= 2 and set(interop) | set(other) == {"gw0", "gw1"}, done.stdout


def test_a_test_with_a_cluster_of_its_own_is_its_own_scope() -> None:
    """The interop tests that share no module cluster (``ALONE``) may run beside their
    module; every other interop test stays with its module."""
    split = InteropModuleScheduling._split_scope
    scheduler = object.__new__(InteropModuleScheduling)  # _split_scope reads no state
    restart = "tests/interop/test_gcs_restart_real_ray.py::test_gcs_killed[redis]"
    assert split(scheduler, restart) == restart
    pgs = "tests/interop/test_placement_groups_real_ray.py"
    for shared in ("test_removed_group", "test_a_placed_group_survives_a_gcs_restart"):
        assert split(scheduler, f"{pgs}::{shared}") == pgs
    other = "tests/unit/test_x.py::TestY::test_z"
    assert split(scheduler, other) == other
    # a module elsewhere whose module-scoped fixture starts a demo cluster: one scope
    readme = "tests/cli/test_readme.py::TestQuickstart::test_commands_run_against_the_demo"
    assert split(scheduler, readme) == "tests/cli/test_readme.py"


def test_scopes_are_handed_out_longest_first() -> None:
    """The measured costs order the queue (the long interop modules first, so none of them
    starts last); scopes without a cost keep xdist's order behind them."""
    queue = {
        "tests/unit/test_a.py::test_1": {},
        "tests/interop/test_real_cluster.py": {},
        "tests/unit/test_b.py::test_2": {},
        "tests/interop/test_dashboard.py": {},
        "tests/interop/test_gcs_restart_real_ray.py::test_x[sqlite]": {},
    }
    rank(queue)
    assert list(queue) == [
        "tests/interop/test_dashboard.py",
        "tests/interop/test_gcs_restart_real_ray.py::test_x[sqlite]",
        "tests/interop/test_real_cluster.py",
        "tests/unit/test_a.py::test_1",
        "tests/unit/test_b.py::test_2",
    ]
