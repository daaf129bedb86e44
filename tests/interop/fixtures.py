"""Fixtures giving tests the real Ray 2.60 / ant-ray 2.44 wheels in cached virtualenvs, and
the hook that builds them before any test runs (a pytest plugin: tests/conftest.py loads it).

``ray_venv`` / ``ray_default_venv`` (``ray[default]``: the dashboard) / ``ant_ray_venv``: a
:class:`~tests.interop.venvs.Venv`; ``ray_wheel`` / ``ant_ray_wheel``: the raw wheel files;
``ray_venv_with_gcs``: the Ray venv plus our runtime dependencies, with the environment
(``PYTHONPATH``) that makes ``import gcs`` load this checkout.

Fixtures never build: a pip install inside a test ran into pytest's 300 s per-test timeout
on a busy machine, and the failed session fixture then failed every later test of its
worker.  What the collected tests need is built when collection ends
(:func:`pytest_collection_finish`: before any test, outside the per-test timeout, a line per
step on stderr); ``scripts/test.sh`` builds everything earlier still
(``python -m tests.interop.venvs``).  A fixture whose venv is missing fails at once naming
that command.  ``GCS_INTEROP_BUILD=0`` leaves building to that command.  If the build
before the tests failed (no network) the tests that need it skip with the reason, or fail
with ``GCS_INTEROP_REQUIRED=1`` (CI; scripts/test.sh).
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import pytest

from tests.interop import prebuild, venvs

T = TypeVar("T")

BUILD_FAILURES = pytest.StashKey[dict[str, str]]()
"""Needs whose build before the tests failed (this process), with the reason."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what the collected tests need, before any of them runs (each pytest-xdist
    worker collects and gets here; the venvs' locks let one build and the others wait)."""
    config = session.config
    config.stash[BUILD_FAILURES] = {}
    if config.option.collectonly or os.environ.get("GCS_INTEROP_BUILD") == "0":
        return
    names = prebuild.needs_of({f for item in session.items for f in item.fixturenames})
    missing = [name for name in names if not prebuild.NEEDS[name].ready()]
    if not missing:
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "")
    prefix = f"[{worker}] " if worker else ""

    def write(line: str) -> None:
        print(prefix + line, file=sys.stderr, flush=True)

    write(f"building before the tests: {', '.join(missing)} (`{venvs.BUILD_COMMAND}`)")
    failures = prebuild.build(missing, prebuild.Reporter(write))
    config.stash[BUILD_FAILURES] = failures


def obtain(failures: Mapping[str, str], needs: tuple[str, ...], get: Callable[[], T]) -> T:
    """``get()`` (which never builds), or at once a failure naming the build command; a
    skip if the build before the tests failed (``failures``: need -> reason), unless
    ``GCS_INTEROP_REQUIRED=1``."""
    try:
        return get()
    except venvs.VenvError as exc:
        failed = [f"{name}: {failures[name]}" for name in needs if name in failures]
        if failed and os.environ.get("GCS_INTEROP_REQUIRED") != "1":
            pytest.skip(f"cannot build the virtualenv: {'; '.join(failed)}")
        reason = f" (its build before the tests failed: {'; '.join(failed)})" if failed else ""
        pytest.fail(f"{exc}{reason}", pytrace=False)


def build_failures(config: pytest.Config) -> dict[str, str]:
    return config.stash.get(BUILD_FAILURES, {})


def _venv(spec: venvs.VenvSpec) -> Callable[[], venvs.Venv]:
    return lambda: venvs.require_venv(spec)


def _wheel(dist: str) -> Callable[[], pathlib.Path]:
    def get() -> pathlib.Path:
        found = venvs.cached_wheel(dist)
        if found is None:
            raise venvs.VenvMissing(
                f"the {venvs.SPECS[dist].requirement} wheel is not in {venvs.cache_root()}/"
                f"wheels: download it with `{venvs.BUILD_COMMAND}`"
            )
        return found

    return get


@pytest.fixture(scope="session")
def ray_venv(pytestconfig: pytest.Config) -> venvs.Venv:
    return obtain(build_failures(pytestconfig), ("ray",), _venv(venvs.RAY))


@pytest.fixture(scope="session")
def ray_default_venv(pytestconfig: pytest.Config) -> venvs.Venv:
    """``ray[default]==2.60.0``: the dashboard, ``ray list``, ``ray job``."""
    return obtain(build_failures(pytestconfig), ("ray-default",), _venv(venvs.RAY_DEFAULT))


@pytest.fixture(scope="session")
def ant_ray_venv(pytestconfig: pytest.Config) -> venvs.Venv:
    return obtain(build_failures(pytestconfig), ("ant-ray",), _venv(venvs.ANT_RAY))


@pytest.fixture(scope="session")
def ray_wheel(pytestconfig: pytest.Config) -> pathlib.Path:
    return obtain(build_failures(pytestconfig), ("ray",), _wheel("ray"))


@pytest.fixture(scope="session")
def ant_ray_wheel(pytestconfig: pytest.Config) -> pathlib.Path:
    """``GCS_ANTRAY_WHEEL`` (a wheel file of one's own), else the cache's."""
    env = os.environ.get("GCS_ANTRAY_WHEEL")
    if env:
        if not pathlib.Path(env).is_file():
            pytest.fail(f"GCS_ANTRAY_WHEEL={env} is not a file", pytrace=False)
        return pathlib.Path(env)
    return obtain(build_failures(pytestconfig), ("ant-ray",), _wheel("ant-ray"))


@dataclass(frozen=True)
class VenvWithGcs:
    venv: venvs.Venv
    env: dict[str, str]
    """Pass as ``run_in_venv(..., env=env)`` so ``import gcs`` resolves to this checkout."""

    def run(self, script: str, *, timeout: float = 120.0) -> dict:
        return venvs.run_in_venv(self.venv, script, env=self.env, timeout=timeout)


@pytest.fixture(scope="session")
def ray_venv_with_gcs(pytestconfig: pytest.Config) -> VenvWithGcs:
    def get() -> venvs.Venv:
        venv = venvs.require_venv(venvs.RAY)
        if not venvs.has_our_dependencies(venv):
            raise venvs.VenvMissing(
                f"our runtime dependencies are not installed in {venv.path}: "
                f"install them with `{venvs.BUILD_COMMAND}`"
            )
        return venv

    venv = obtain(build_failures(pytestconfig), ("ray+gcs",), get)
    return VenvWithGcs(venv, venvs.with_our_package())
