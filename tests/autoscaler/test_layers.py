"""The import layers inside ``gcs.autoscaler`` (listed in its package docstring): a module
imports only from its own layer or lower ones, and never from the server's side."""

from __future__ import annotations

import ast
from pathlib import Path

import gcs.autoscaler
import gcs.policy.autoscaling
from tests.import_graph import circles

PACKAGE = Path(gcs.autoscaler.__file__).parent
#: The autoscaler's pure parts (value types, scheduler, capacity cache) are policy.
POLICY = Path(gcs.policy.autoscaling.__file__).parent

#: Lowest first; a module belongs to the first entry its dotted name starts with.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("providers.registry",),
    ("launcher_yaml", "node_resources", "config", "cluster_state"),
    ("instances",),
    ("gcs_api", "grpc_gcs"),
    ("providers",),
    ("reconciler",),
    ("runtime", "metrics", "simulator"),
    ("planner",),
)
FORBIDDEN = ("gcs.server", "gcs.managers", "gcs.services")


def layer_of(module: str) -> int:
    """``module`` relative to ``gcs.autoscaler``, e.g. ``providers.kuberay.provider``."""
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return index
    raise AssertionError(f"gcs.autoscaler.{module} is in no layer: add it to LAYERS")


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts:
            out[".".join(parts)] = path
    return out


def imports(path: Path) -> list[str]:
    """Every module imported, TYPE_CHECKING and function-local imports included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
    return out


class TestLayers:
    def test_every_module_has_a_layer(self) -> None:
        for module in modules():
            layer_of(module)

    def test_imports_only_point_down(self) -> None:
        wrong = []
        for module, path in modules().items():
            mine = layer_of(module)
            for target in imports(path):
                if not target.startswith("gcs.autoscaler."):
                    continue
                theirs = layer_of(target.removeprefix("gcs.autoscaler."))
                if theirs > mine:
                    wrong.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
        assert wrong == []

    def test_never_imports_the_server_side(self) -> None:
        wrong = [
            f"{module} imports {target}"
            for module, path in modules().items()
            for target in imports(path)
            if target.startswith(FORBIDDEN)
        ]
        assert wrong == []


SCHEDULER = "scheduler"
VALUE_TYPES = "scheduler.types"


def scheduler_graph() -> dict[str, set[str]]:
    """Scheduler module -> the scheduler modules it imports (TYPE_CHECKING ones included:
    a circle drawn only for the type checker is still a circle to a reader)."""
    mods = {
        m: p for m, p in modules(POLICY).items() if m == SCHEDULER or m.startswith(SCHEDULER + ".")
    }
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        targets = set()
        for target in imports(path):
            rel = target.removeprefix("gcs.policy.autoscaling.")
            if rel in mods and rel != module:
                targets.add(rel)
        graph[module] = targets
    return graph


class TestScheduler:
    def test_the_value_types_import_no_other_scheduler_module(self) -> None:
        """``scheduler.types`` is the bottom: every value the scheduler takes or gives
        (``WaitingDemand`` included) is defined where nothing points back."""
        assert scheduler_graph()[VALUE_TYPES] == set()

    def test_no_import_circle_inside_the_scheduler(self) -> None:
        # the package imports its parts to re-export them: not a circle of the parts
        graph = {m: t - {SCHEDULER} for m, t in scheduler_graph().items() if m != SCHEDULER}
        assert circles(graph) == []

    def test_the_circle_finder_sees_a_circle(self) -> None:
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        assert circles(graph) == [["a", "b", "c"]]


MAX_LINES = 600


def test_no_file_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


#: The planner (what ``gcs autoscaler plan`` prints) and the simulator are tools, not the
#: embedded runtime.
RUNTIME_EXEMPT = ("planner", "simulator")
#: (module, what): why it is still there.  Empty this list, do not grow it.
RUNTIME_ALLOWED = {
    ("instances.manager", "asyncio.ensure_future"): "the write lane finishes a batch under "
    "the caller's cancellation (the idiom of gcs.managers.lane, which the autoscaler may not "
    "import); it is awaited before the lane is released, never left running",
}
WALL_CLOCK = {"time", "datetime"}
RAW_TASKS = {"create_task", "ensure_future"}
RAW_WAITS = {"sleep", "wait_for", "timeout", "timeout_at"}


def runtime_violations(module: str, source: str) -> list[str]:
    """Raw tasks, sleeps, time limits and wall-clock reads in ``source``: work runs through
    ``gcs.base.background.Background`` (its failure policy), time on the injected clock."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [f"import {a.name}" for a in node.names if a.name in WALL_CLOCK]
        elif isinstance(node, ast.ImportFrom) and node.module in WALL_CLOCK:
            out.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else "..."
            if node.attr in RAW_TASKS:
                out.append(f"{owner}.{node.attr}" if owner != "..." else node.attr)
            elif owner == "asyncio" and node.attr in RAW_WAITS:
                out.append(f"asyncio.{node.attr}")
            elif owner == "loop" and node.attr == "time":
                out.append("loop.time")
    return [f"{module}: {what}" for what in out if (module, what) not in RUNTIME_ALLOWED]


def test_the_runtime_side_runs_work_and_time_through_the_house_tools() -> None:
    wrong = []
    for module, path in modules().items():
        if module.split(".")[0] in RUNTIME_EXEMPT:
            continue
        wrong += runtime_violations(module, path.read_text())
    assert wrong == []


def test_the_runtime_checker_sees_raw_tasks_sleeps_and_wall_time() -> None:
    source = (
        "import asyncio, time\n"
        "async def f(loop):\n"
        "    asyncio.get_running_loop().create_task(g())\n"
        "    await asyncio.sleep(1)\n"
        "    await asyncio.wait_for(g(), 1)\n"
        "    return loop.time()\n"
    )
    assert sorted(runtime_violations("m", source)) == [
        "m: asyncio.sleep",
        "m: asyncio.wait_for",
        "m: create_task",
        "m: import time",
        "m: loop.time",
    ]
