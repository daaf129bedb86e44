"""The import layers inside ``gcs.autoscaler`` (listed in its package docstring): a module
imports only from its own layer or lower ones, and never from the server's side."""

from __future__ import annotations

import ast
from pathlib import Path

import gcs.autoscaler

PACKAGE = Path(gcs.autoscaler.__file__).parent

#: Lowest first; a module belongs to the first entry its dotted name starts with.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("model", "deadline", "providers.registry"),
    ("scheduler", "capacity"),
    ("config", "cluster_state"),
    ("instances",),
    ("gcs_api", "grpc_gcs"),
    ("providers",),
    ("reconciler",),
    ("runtime", "metrics", "simulator"),
    ("planner", "cli", "run_cli"),
)
FORBIDDEN = ("gcs.server", "gcs.managers", "gcs.services")


def layer_of(module: str) -> int:
    """``module`` relative to ``gcs.autoscaler``, e.g. ``providers.kuberay.provider``."""
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return index
    raise AssertionError(f"gcs.autoscaler.{module} is in no layer: add it to LAYERS")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
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
