"""One way to run work on the GCS process's side (issue 28, items 3 and 4).

* Time: every sleep, timer and time limit is on the injected clock (``gcs.base.clock``:
  ``Clock.sleep``, ``Clock.call_later``, ``Clock.timeout`` / ``within``), so a test moves it
  with a FakeClock.  No ``asyncio.sleep`` (but ``asyncio.sleep(0)``, a yield that takes no
  time), ``time.sleep``, ``loop.call_later`` / ``call_at``, ``asyncio.wait_for`` /
  ``asyncio.wait`` with a timeout, ``asyncio.timeout`` outside ``gcs/base/clock.py`` -- except
  the ONE loop-lag probe (:data:`LAG_PROBE`), which measures how late a wall-clock sleep
  wakes and so must sleep on wall time.
* Tasks: a loop is a component's ``run()`` under the lifecycle Supervisor; other work a
  component starts goes through ``gcs.base.background.Background`` (one failure policy, closed
  with its owner).  No ``asyncio.create_task`` / ``ensure_future`` / ``loop.create_task``
  outside ``gcs/base/lifecycle.py`` and ``gcs/base/background.py``.  An ``asyncio.TaskGroup``'s
  ``create_task`` is allowed: its tasks end with its ``async with`` block.

Scope: the GCS process's side (managers, services, rpc, store, server, publishers, the
embedded autoscaler); not the command lines, the raylet agent, the SDK, test helpers or the
drop-in (they run in other processes or are tools).
"""

from __future__ import annotations

import ast
import fnmatch
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCOPE = (
    "gcs/managers/",
    "gcs/services/",
    "gcs/rpc/",
    "gcs/store/",
    "gcs/server/",
    "gcs/managers/pubsub/",
    "gcs/autoscaler/",
    "gcs/base/lifecycle.py",
    "gcs/base/background.py",
)
OUT_OF_SCOPE = (
    "gcs/sdk/_subscriber.py",  # a client, runs in Ray's processes' place (tests, SDK)
    "gcs/cli/store.py",  # a command line
    "gcs/store/migrations/*",  # alembic scripts
    "gcs/cli/autoscaler.py",  # command lines
    "gcs/cli/autoscaler_run.py",
    "gcs/autoscaler/simulator/*",  # a tool: the real reconciler on a virtual clock
)
TASK_OWNERS = frozenset({"gcs/base/lifecycle.py", "gcs/base/background.py"})
LAG_PROBE = ("gcs/rpc/raylet_io/rate.py", "LagGovernor.run")
"""The one documented wall-clock sleep: it measures event-loop lag (how late a sleep wakes),
which only wall time shows."""

EXEMPT: frozenset[str] = frozenset()


def _dotted(node: ast.expr) -> str:
    """``asyncio.get_running_loop().create_task`` -> "asyncio.get_running_loop().create_task"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return f"{_dotted(node.func)}()"
    return "?"


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, 0.0)


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _timeout_arg(call: ast.Call, position: int) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "timeout":
            return keyword.value
    return call.args[position] if len(call.args) > position else None


def _imported_sleeps(tree: ast.Module) -> set[str]:
    """Names bound by ``from asyncio import sleep`` / ``from time import sleep as nap``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("asyncio", "time"):
            names |= {a.asname or a.name for a in node.names if a.name == "sleep"}
    return names


def wall_clock_uses(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, enclosing function, what) for each wall-clock sleep, timer or time limit."""
    found: list[tuple[int, str, str]] = []
    sleeps = _imported_sleeps(tree)

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                what = _wall_clock(child, sleeps)
                if what:
                    found.append((child.lineno, where, what))
            visit(child, inner)

    visit(tree, "")
    return found


def _is_clock(receiver: str) -> bool:
    """``clock``, ``self._clock``, ``shared.clock``: an injected Clock's timer is allowed."""
    return receiver.rpartition(".")[2].lstrip("_").endswith("clock")


def _wall_clock(call: ast.Call, sleeps: set[str]) -> str:
    name = _dotted(call.func)
    if name in ("asyncio.sleep", *sleeps):
        return "" if call.args and _is_zero(call.args[0]) else f"{name}()"
    if name == "time.sleep":
        return "time.sleep()"
    receiver, _, method = name.rpartition(".")
    if method in ("call_later", "call_at") and not _is_clock(receiver):
        return f"{name}()"
    if name in ("asyncio.timeout", "asyncio.timeout_at"):
        return f"{name}()"
    if name == "asyncio.wait_for":
        limit = _timeout_arg(call, 1)
        return "" if limit is None or _is_none(limit) else "asyncio.wait_for() with a timeout"
    if name == "asyncio.wait":
        limit = _timeout_arg(call, 99)  # keyword only
        return "" if limit is None or _is_none(limit) else "asyncio.wait() with a timeout"
    return ""


def _starts_task(name: str) -> bool:
    if name in ("asyncio.create_task", "asyncio.ensure_future", "ensure_future"):
        return True
    receiver = name.removesuffix(".create_task")
    return receiver != name and not receiver.lower().endswith("group")  # TaskGroup: allowed


def task_starts(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for each task started outside the Supervisor / Background."""
    return [
        (node.lineno, f"{_dotted(node.func)}()")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _starts_task(_dotted(node.func))
    ]


def _matches(rel: str, patterns: frozenset[str] | tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in patterns)


def checked_files(root: pathlib.Path) -> list[str]:
    files = []
    for path in sorted((root / "gcs").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not rel.startswith(SCOPE) or _matches(rel, OUT_OF_SCOPE):
            continue
        files.append(rel)
    return files


def violations(root: pathlib.Path, exempt: frozenset[str] = EXEMPT) -> list[str]:
    """Every wall-clock use and task start on the GCS process's side, as ``path:line: what``."""
    out: list[str] = []
    for rel in checked_files(root):
        if _matches(rel, exempt):
            continue
        tree = ast.parse((root / rel).read_text(), rel)
        for line, where, what in wall_clock_uses(tree):
            if (rel, where) != LAG_PROBE:
                out.append(f"{rel}:{line}: wall clock: {what} (in {where or 'module'})")
        if rel not in TASK_OWNERS:
            out.extend(
                f"{rel}:{line}: task outside Supervisor/Background: {what}"
                for line, what in task_starts(tree)
            )
    return out


def test_no_wall_clock_and_no_stray_tasks_on_the_gcs_side() -> None:
    found = violations(ROOT)
    assert not found, "\n".join(found)


def test_the_lag_probe_is_the_only_wall_clock_sleep_and_exists() -> None:
    """The allowed probe is real (a rename would silently widen nothing, but say so)."""
    path, where = LAG_PROBE
    tree = ast.parse((ROOT / path).read_text())
    assert [what for _, w, what in wall_clock_uses(tree) if w == where] == ["asyncio.sleep()"]


def test_the_scope_is_what_the_issue_names() -> None:
    files = checked_files(ROOT)
    assert "gcs/managers/load_poller.py" in files and "gcs/server/head_processes.py" in files
    assert "gcs/rpc/raylet_io/grpc_gateway.py" in files and "gcs/store/sql/store.py" in files
    assert not any(
        f.startswith(("gcs/raylet/", "gcs/sdk/", "gcs/testing/", "gcs/cli/dropin/")) for f in files
    )
    assert "gcs/sdk/_subscriber.py" not in files and "gcs/cli/main.py" not in files


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("import asyncio\nasync def f():\n    await asyncio.sleep(1)\n", "wall"),
        ("from asyncio import sleep\nasync def f():\n    await sleep(0.5)\n", "wall"),
        ("import time\ndef f():\n    time.sleep(1)\n", "wall"),
        ("def f(loop, cb):\n    loop.call_later(1, cb)\n", "wall"),
        ("import asyncio\nasync def f(c):\n    await asyncio.wait_for(c, 2)\n", "wall"),
        ("import asyncio\nasync def f(c):\n    await asyncio.wait_for(c, timeout=2)\n", "wall"),
        ("import asyncio\nasync def f(c):\n    await asyncio.wait({c}, timeout=2)\n", "wall"),
        (
            "import asyncio\nasync def f():\n    async with asyncio.timeout(1):\n        pass\n",
            "wall",
        ),
        ("import asyncio\ndef f(c):\n    asyncio.create_task(c)\n", "task"),
        ("import asyncio\ndef f(c):\n    asyncio.ensure_future(c)\n", "task"),
        ("import asyncio\ndef f(c):\n    asyncio.get_running_loop().create_task(c)\n", "task"),
        ("def f(self, c):\n    self._loop.create_task(c)\n", "task"),
        ("import asyncio\nasync def f():\n    await asyncio.sleep(0)\n", ""),
        ("import asyncio\nasync def f(c):\n    await asyncio.wait_for(c, None)\n", ""),
        ("async def f(clock):\n    await clock.sleep(1)\n", ""),
        ("def f(clock, cb):\n    clock.call_later(1, cb)\n", ""),
        ("def f(self, cb):\n    self._clock.call_later(1, cb)\n", ""),
        ("async def f(group, c):\n    group.create_task(c)\n", ""),
    ],
)
def test_the_checker_sees_each_kind(source: str, kind: str) -> None:
    """The checker itself: each forbidden form is found, each allowed one is not."""
    tree = ast.parse(source)
    found = (["wall"] if wall_clock_uses(tree) else []) + (["task"] if task_starts(tree) else [])
    assert found == ([kind] if kind else [])
