"""The actor manager is split by phase: small modules, background work through
``Background``, time from the injected clock only (checked over the package's AST)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gcs" / "managers" / "actors"
MODULES = sorted(PACKAGE.glob("*.py"))
PHASES = ("register", "create", "schedule", "restart", "destroy", "load", "view", "table")
WALL_TIME = {("asyncio", "sleep"), ("time", "time"), ("time", "monotonic"), ("time", "sleep")}


def _attributes(path: pathlib.Path) -> list[tuple[str, str]]:
    """(owner, attribute) of every ``owner.attribute`` in the module (called or passed on,
    e.g. ``asyncio.sleep`` as a default)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            out.append((owner.id if isinstance(owner, ast.Name) else "", node.attr))
    return out


def test_the_old_module_is_a_package_with_one_module_per_phase() -> None:
    assert not (PACKAGE.parent / "actors.py").exists()
    for phase in PHASES:
        assert (PACKAGE / f"{phase}.py").exists(), phase


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_each_module_stays_small(path: pathlib.Path) -> None:
    assert len(path.read_text().splitlines()) <= 400, path.name


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_raw_task_and_no_wall_clock(path: pathlib.Path) -> None:
    """Tasks start through ``gcs.base.background.Background``; sleeps go through the clock."""
    used = _attributes(path)
    assert not [c for c in used if c[1] in ("create_task", "ensure_future")], path.name
    assert not [c for c in used if c in WALL_TIME], path.name
