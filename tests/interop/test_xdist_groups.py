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
