"""The store layer's shape, checked over the source (AST, nothing imported):

* no import circle among ``gcs/store`` modules (function-local imports count: they were
  how ``migrate`` <-> ``sql`` and ``redis_topology`` <-> ``redis_cluster`` hid);
* no wall-clock wait: every sleep and retry wait runs on the injected ``gcs.base.clock.Clock``;
* no module over 600 lines.

Each checker is run on a small tree that breaks its rule, so a checker that finds nothing
cannot pass by accident."""

from __future__ import annotations

import ast
import pathlib

import pytest

STORE = pathlib.Path(__file__).resolve().parents[2] / "gcs" / "store"
MAX_LINES = 600
WALL_CLOCK_WAITS = {("asyncio", "sleep"), ("time", "sleep")}


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted name -> file, for every module under ``root`` (a ``gcs/store`` folder)."""
    base = root.parent.parent  # the folder holding ``gcs``
    found: dict[str, pathlib.Path] = {}
    for path in sorted(root.rglob("*.py")):
        if "migrations" in path.relative_to(root).parts:
            continue  # Alembic scripts: loaded by Alembic, not imported
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, here: str, modules: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ``modules`` that ``tree`` imports anywhere (top level or local)."""
    out: set[str] = set()
    package = here if modules[here].name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import mod`` imports the module; ``from mod import name`` the module
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        out.update(name for name in names if name in modules and name != here)
    return out


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    modules = _modules(root)
    return {
        name: _imported(ast.parse(path.read_text()), name, modules)
        for name, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def wall_clock_waits(root: pathlib.Path) -> list[str]:
    """``file:line`` of every ``asyncio.sleep`` / ``time.sleep`` call or import under root."""
    hits: list[str] = []
    for name, path in _modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if (node.value.id, node.attr) in WALL_CLOCK_WAITS:
                    hits.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and any(
                (node.module, alias.name) in WALL_CLOCK_WAITS for alias in node.names
            ):
                hits.append(f"{name}:{node.lineno}")
    return hits


def oversized(root: pathlib.Path) -> list[str]:
    return [
        f"{name} ({n} lines)"
        for name, path in _modules(root).items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]


class TestTheStoreLayer:
    def test_no_module_of_the_store_imports_itself_round_a_circle(self) -> None:
        """The import graph of gcs/store has no circle, local imports included."""
        assert circles(import_graph(STORE)) == []

    def test_the_store_waits_only_on_its_injected_clock(self) -> None:
        """No asyncio.sleep / time.sleep anywhere in gcs/store."""
        assert wall_clock_waits(STORE) == []

    def test_no_store_module_is_over_600_lines(self) -> None:
        """Each backend is split by concern long before a thousand lines."""
        assert oversized(STORE) == []

    def test_no_backend_imports_another(self) -> None:
        """A backend sub-package imports the interface (``gcs.store.*``), never another
        backend: each can be added or removed alone."""
        backends = ("gcs.store.memory", "gcs.store.redis", "gcs.store.sql")

        def backend_of(module: str) -> str | None:
            return next((b for b in backends if module == b or module.startswith(b + ".")), None)

        crossings = [
            f"{module} imports {target}"
            for module, targets in import_graph(STORE).items()
            for target in sorted(targets)
            if backend_of(module) and backend_of(target) not in (None, backend_of(module))
        ]
        assert crossings == []

    def test_each_backend_is_its_own_sub_package(self) -> None:
        """memory, redis and sql are folders; no backend module is loose in gcs/store."""
        for backend in ("memory", "redis", "sql"):
            assert (STORE / backend / "__init__.py").is_file()
        loose = sorted(p.stem for p in STORE.glob("*.py"))
        assert not [m for m in loose if m.startswith(("redis", "sql", "memory", "migrate"))]


class TestTheCheckers:
    """Each checker finds what it is for, on a tree written to break it."""

    @pytest.fixture
    def tree(self, tmp_path: pathlib.Path) -> pathlib.Path:
        root = tmp_path / "gcs" / "store"
        (root / "sql").mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "sql" / "__init__.py").write_text("")
        (root / "sql" / "store.py").write_text(
            "import asyncio\nfrom gcs.store.sql import migrate\n"
            "async def f():\n    await asyncio.sleep(1)\n"
        )
        (root / "sql" / "migrate.py").write_text(
            "from time import sleep\ndef upgrade():\n    from gcs.store.sql.store import f\n"
        )
        (root / "base.py").write_text("x = 1\n" * (MAX_LINES + 1))
        return root

    def test_a_circle_through_a_local_import_is_found(self, tree: pathlib.Path) -> None:
        assert circles(import_graph(tree)) == [["gcs.store.sql.migrate", "gcs.store.sql.store"]]

    def test_wall_clock_sleeps_are_found(self, tree: pathlib.Path) -> None:
        assert wall_clock_waits(tree) == ["gcs.store.sql.migrate:1", "gcs.store.sql.store:4"]

    def test_a_long_module_is_found(self, tree: pathlib.Path) -> None:
        assert oversized(tree) == [f"gcs.store.base ({MAX_LINES + 1} lines)"]
