"""A few of Ray's own test files, run by Ray 2.60 with ``gcs-server`` in place of its
``gcs_server`` (``bench/ray_suite.py`` runs them all, on stock Ray too).  Every test of
these files passes on stock Ray 2.60; each must pass here.  Ray's files are run, never
copied into this repository (``/work/shared/ray-tests``, or ``$GCS_RAY_TESTS``)."""

from __future__ import annotations

import pytest

from bench import ray_suite
from tests.interop import venvs
from tests.interop.fixtures import build_failures, obtain

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("ray_suite_smoke")]

SMOKE_FILES = (
    ("test_get_or_create_actor.py", None),
    ("test_list_actors_2.py", None),
    ("test_list_actors_3.py", None),
    ("test_list_actors_4.py", None),
    ("test_implicit_resource.py", "test_implicit_resource and not autoscaling"),
)
"""Small files (or the tests of them, ``-k``) that pass on stock Ray 2.60: clusters started
by ``ray.init()`` / ``ray_start_regular``, drivers in subprocesses, named and detached actors,
``ray.kill`` with and without restart, ``get_if_exists``, ``list_actors`` filtered by id
(the autoscaling tests of test_implicit_resource.py need a file the wheel lacks, on stock
too)."""


@pytest.fixture(scope="module")
def ray_suite_venv(pytestconfig: pytest.Config) -> venvs.Venv:
    """Built before the tests (tests.interop.prebuild); here only Ray's test files are put
    in (again when they changed) and our launcher refreshed."""
    if not ray_suite.has_tests():
        pytest.skip(f"Ray's test files are not at {ray_suite.SUITE_SOURCE} (GCS_RAY_TESTS)")
    failures = build_failures(pytestconfig)
    return obtain(failures, ("ray-suite",), lambda: ray_suite.prepare("ours", build=False))


@pytest.mark.parametrize(("test_file", "keyword"), SMOKE_FILES)
def test_rays_own_tests_pass_on_gcs_server(
    ray_suite_venv: venvs.Venv, test_file: str, keyword: str | None
) -> None:
    run = ray_suite.run_file(
        ray_suite_venv,
        test_file,
        test_timeout_s=120,
        file_timeout_s=170,
        extra_args=("-k", keyword) if keyword else (),
    )
    misses = {
        t: f"[{r.outcome}] {r.message}" for t, r in run.tests.items() if r.outcome != "passed"
    }
    assert run.tests, run.note
    assert misses == {}, run.note
