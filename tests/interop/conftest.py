"""Fixtures giving tests the real Ray 2.60 / ant-ray 2.44 wheels in cached virtualenvs.

``ray_venv`` / ``ray_default_venv`` (``ray[default]``: the dashboard) / ``ant_ray_venv``: a
:class:`~tests.interop.venvs.Venv` (built on first use, then cached under
``$GCS_INTEROP_CACHE``).  ``ray_venv_with_gcs``: the Ray venv plus our
runtime dependencies, with the environment (``PYTHONPATH``) that makes ``import gcs`` load
this checkout.  When a venv cannot be built (no network), the tests skip with the reason;
set ``GCS_INTEROP_REQUIRED=1`` (CI) to turn that skip into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest

from tests.interop import venvs

T = TypeVar("T")


def _obtain(build: Callable[[], T], what: str) -> T:
    try:
        return build()
    except venvs.VenvError as exc:
        message = f"cannot build the {what} virtualenv: {exc}"
        if os.environ.get("GCS_INTEROP_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def ray_venv() -> venvs.Venv:
    return _obtain(lambda: venvs.ensure_venv(venvs.RAY), "ray==2.60.0")


@pytest.fixture(scope="session")
def ray_default_venv() -> venvs.Venv:
    """``ray[default]==2.60.0``: the dashboard, ``ray list``, ``ray job``."""
    return _obtain(lambda: venvs.ensure_venv(venvs.RAY_DEFAULT), "ray[default]==2.60.0")


@pytest.fixture(scope="session")
def ant_ray_venv() -> venvs.Venv:
    return _obtain(lambda: venvs.ensure_venv(venvs.ANT_RAY), "ant-ray==2.44.1.1")


@dataclass(frozen=True)
class VenvWithGcs:
    venv: venvs.Venv
    env: dict[str, str]
    """Pass as ``run_in_venv(..., env=env)`` so ``import gcs`` resolves to this checkout."""

    def run(self, script: str, *, timeout: float = 120.0) -> dict:
        return venvs.run_in_venv(self.venv, script, env=self.env, timeout=timeout)


@pytest.fixture(scope="session")
def ray_venv_with_gcs(ray_venv: venvs.Venv) -> VenvWithGcs:
    _obtain(lambda: venvs.ensure_our_dependencies(ray_venv), "ray + gcs dependencies")
    return VenvWithGcs(ray_venv, venvs.with_our_package())
