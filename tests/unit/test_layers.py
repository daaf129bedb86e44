"""Imports only point down the layers of docs/architecture.md, and each layer is folders.

Every module of ``gcs`` lives in a folder, and every folder is in exactly one layer of
:data:`LAYERS` (lowest first); a module may import modules of its own layer or of layers
below, never above.  Nothing is loose at ``gcs/`` beyond the package's entry points.  Pure
policy (``gcs.policy``) additionally imports no I/O at all.  The autoscaler's own internal
order is checked by its own test; the cross-package rules are here.  A new folder must be
placed in a layer (the test fails on an unplaced one), so the picture stays true.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from tests.import_graph import circles

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gcs"

# Lowest first: each layer is a list of folders (packages) of gcs/.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("gcs", "gcs.base", "gcs.proto")),  # "gcs": the package root (version)
    ("policy", ("gcs.policy",)),  # pure: values in, values out (see PURE below)
    ("store", ("gcs.store",)),  # one interface, a sub-package per backend
    ("config", ("gcs.config",)),
    ("rpc", ("gcs.rpc",)),  # gRPC plumbing, the raylet I/O layer (gcs.rpc.raylet_io)
    ("managers", ("gcs.managers",)),  # own the state (the publishers too)
    ("services", ("gcs.services",)),  # each RPC method's behaviour, once
    ("front", ("gcs.front",)),  # the GCS port: transports over the services
    ("clients", ("gcs.sdk", "gcs.raylet", "gcs.autoscaler", "gcs.testing")),
    ("server", ("gcs.server",)),  # the composition root: may build anything below
    ("entry", ("gcs.cli", "gcs.__main__")),  # every command line
)

ENTRY_POINTS = ("__init__.py", "__main__.py", "py.typed")
"""What may stand loose at ``gcs/``: the package's own entry points."""

PURE = ("gcs.policy",)
"""Policy: no I/O, no hidden clock or randomness (time and ids are injected)."""
PURE_EXCEPT: tuple[str, ...] = ()
IO_MODULES = (
    "asyncio", "socket", "subprocess", "grpc", "redis", "sqlalchemy", "asyncpg", "aiosqlite",
    "kubernetes_asyncio", "aiohttp", "httpx", "time", "random", "uuid", "os",
    "gcs.store", "gcs.rpc", "gcs.managers", "gcs.services", "gcs.front", "gcs.server",
    "gcs.raylet", "gcs.sdk",
)  # fmt: skip

ALLOWED: dict[tuple[str, str], str] = {
    # (importer, imported): why it is still there.  Empty this list, do not grow it.
}

_RANK = {prefix: rank for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}
_NAME = {rank: name for rank, (name, _) in enumerate(LAYERS)}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _prefix(module: str, prefixes: object) -> str | None:
    best = None
    for prefix in prefixes:  # type: ignore[attr-defined]
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return best


def layer_of(module: str) -> int | None:
    prefix = _prefix(module, _RANK)
    return _RANK[prefix] if prefix is not None and (prefix != "gcs" or module == "gcs") else None


def _imports(path: pathlib.Path) -> list[str]:
    """Modules imported by ``path`` (absolute imports; ``from gcs.x import y`` counts as
    ``gcs.x.y`` when that is a module, else ``gcs.x``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                as_path = ROOT / pathlib.Path(*candidate.split("."))
                out.append(
                    candidate
                    if as_path.with_suffix(".py").exists() or as_path.is_dir()
                    else node.module
                )
    return out


MODULES = {
    _module_name(path): path
    for path in sorted(PACKAGE.rglob("*.py"))
    if "proto" not in path.relative_to(PACKAGE).parts[:1]
    and "migrations" not in path.relative_to(PACKAGE).parts
}


def test_every_module_is_placed_in_a_layer() -> None:
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert unplaced == [], "add these modules to LAYERS (docs/architecture.md too)"


def test_folders_are_the_layers() -> None:
    """Every folder of ``gcs/`` is a layer's, each in one layer only, and nothing but the
    package's entry points stands loose at ``gcs/``."""
    folders = sorted(
        f"gcs.{p.name}" for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py"))
    )
    listed = [prefix for _, prefixes in LAYERS for prefix in prefixes if prefix != "gcs"]
    assert sorted(f for f in listed if f != "gcs.__main__") == folders
    assert len(listed) == len(set(listed))
    loose = sorted(p.name for p in PACKAGE.iterdir() if p.is_file() and p.name not in ENTRY_POINTS)
    assert loose == [], f"loose modules at gcs/: {loose}; give each a layer's folder"


def test_a_layer_prefix_is_a_whole_folder() -> None:
    """A layer names packages, never a module inside another layer's folder."""
    for _, prefixes in LAYERS:
        for prefix in prefixes:
            if prefix in ("gcs", "gcs.__main__"):
                continue
            assert prefix.count(".") == 1 and (PACKAGE / prefix.split(".")[1]).is_dir(), prefix


def violations(imports: dict[str, list[str]]) -> list[str]:
    """Imports that point up the layers (and are not in ``ALLOWED``)."""
    wrong = []
    for module, imported_modules in imports.items():
        own = layer_of(module)
        assert own is not None, module
        for imported in imported_modules:
            target = layer_of(imported) if imported.startswith("gcs") else None
            if target is None or target <= own or _allowed(module, imported):
                continue
            wrong.append(f"{module} ({_NAME[own]}) imports {imported} ({_NAME[target]})")
    return wrong


IMPORTS = {module: _imports(path) for module, path in MODULES.items()}


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


def folder_circles(imports: dict[str, list[str]]) -> list[list[str]]:
    """Circles between folders of ``gcs/`` (a layer's sibling folders may import each other
    one way, never both ways round)."""
    graph: dict[str, set[str]] = {}
    for module, imported_modules in imports.items():
        for imported in imported_modules:
            if imported.startswith("gcs.") and _folder(imported) != _folder(module):
                graph.setdefault(_folder(module), set()).add(_folder(imported))
    return circles(graph)


def test_no_folder_circle() -> None:
    assert folder_circles(IMPORTS) == []


def test_the_circle_finder_sees_a_folder_circle() -> None:
    assert folder_circles(
        {"gcs.sdk.a": ["gcs.raylet.b"], "gcs.raylet.b": ["gcs.sdk.c"], "gcs.sdk.c": []}
    ) == [["gcs.raylet", "gcs.sdk"]]


def test_imports_point_down_the_layers() -> None:
    assert violations(IMPORTS) == []


def test_the_server_uses_the_autoscaler_through_its_component_only() -> None:
    """The composition root builds the embedded autoscaler from its component and config;
    it does not reach into providers, the reconciler or the scheduler."""
    entry = ("gcs.autoscaler.runtime", "gcs.autoscaler.config")
    wrong = [
        f"{module} imports {imported}"
        for module, imported_modules in IMPORTS.items()
        if module.startswith("gcs.server")
        for imported in imported_modules
        if imported.startswith("gcs.autoscaler")
        and _prefix(imported, entry) is None
        and not _allowed(module, imported)
    ]
    assert wrong == []


def _allowed(module: str, imported: str) -> bool:
    return any(
        (module == importer or module.startswith(importer + "."))
        and (imported == target or imported.startswith(target + "."))
        for importer, target in ALLOWED
    )


@pytest.mark.parametrize("rule", ["managers", "autoscaler", "store"])
def test_cross_package_rules(rule: str) -> None:
    """The rules the layers imply, spelled out: managers never import the protocol layer
    or the server; nothing of the autoscaler imports the server, managers or servicers;
    the store imports nothing of the GCS above it."""
    forbidden = {
        "managers": ("gcs.managers", ("gcs.services", "gcs.front", "gcs.server")),
        "autoscaler": ("gcs.autoscaler", ("gcs.server", "gcs.managers", "gcs.services")),
        "store": ("gcs.store", ("gcs.managers", "gcs.services", "gcs.server", "gcs.rpc")),
    }[rule]
    importer, targets = forbidden
    wrong = [
        f"{module} imports {imported}"
        for module, imported_modules in IMPORTS.items()
        if (module == importer or module.startswith(importer + "."))
        and _NAME[layer_of(module)] != "entry"  # type: ignore[index]
        for imported in imported_modules
        if any(imported == t or imported.startswith(t + ".") for t in targets)
        and not _allowed(module, imported)
    ]
    assert wrong == []


def test_policy_imports_no_io() -> None:
    wrong = []
    for module, imported_modules in IMPORTS.items():
        if _prefix(module, PURE) is None or _prefix(module, PURE_EXCEPT) is not None:
            continue
        for imported in imported_modules:
            if _prefix(imported, IO_MODULES) is not None:
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_the_checker_sees_a_wrong_import() -> None:
    """The rule itself: imports up the layers are caught, down ones are not."""
    assert violations(
        {
            "gcs.managers.nodes": ["gcs.services.node_info", "gcs.store.base"],
            "gcs.store.redis": ["gcs.managers.lane"],
            "gcs.autoscaler.reconciler": ["gcs.server.wiring", "gcs.rpc.client"],
        }
    ) == [
        "gcs.managers.nodes (managers) imports gcs.services.node_info (services)",
        "gcs.store.redis (store) imports gcs.managers.lane (managers)",
        "gcs.autoscaler.reconciler (clients) imports gcs.server.wiring (server)",
    ]


def test_the_server_facade_stays_small() -> None:
    """``server/app.py`` is a facade over the wiring and the supervisor: construction lives in
    ``server/wiring.py``, domain loops in their managers (issue 17 measured it at 937 lines)."""
    lines = (ROOT / "gcs" / "server" / "app.py").read_text().count("\n")
    assert lines < 300, f"gcs/server/app.py has {lines} lines: move construction to wiring.py"
