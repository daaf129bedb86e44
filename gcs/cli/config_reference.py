"""The configuration reference (docs/configuration.md), generated from the one schema.

Every knob is a field of the frozen dataclasses in :mod:`gcs.config.schema`; its description is
the docstring under the field, its environment variables come from ``ENV_VARS``.  Run
``python -m gcs.cli.config_reference > docs/configuration.md``; a test keeps the file current.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Any

from gcs.config import DEFAULT_METRICS_PORT, ENV_VARS, RAY_FILE_KEYS, GcsConfig

_INTRO = f"""\
# Configuration reference

Generated from `gcs/config/schema.py` by `python -m gcs.cli.config_reference`; do not edit by hand.

Precedence: command-line flag > environment variable > `--config` YAML file > default.
In the YAML file, nested keys are written nested (`health: {{period_ms: 1000}}`); Ray's
flat names (the environment names without `RAY_`, e.g. `health_check_period_ms: 1000`) are
accepted too.  Every value is validated once at start-up, and a bad one is refused with the
key and its environment variable named.  Knobs with a Ray name take Ray's whole range with
Ray's meaning (0 is "now", "off" or "no limit", as each row says); our own periods,
timeouts and limits must be above 0.

`gcs serve` exports metrics on port {DEFAULT_METRICS_PORT} unless `--metrics-port`,
`GCS_METRICS_PORT` or the file say otherwise (0 = any free port, -1 = off); the dataclass
default below (0) applies when the server is embedded in a program.

| key | environment | default | meaning |
|---|---|---|---|
"""


def _field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under dataclass fields (``x: int = 1`` then ``\"\"\"...\"\"\"``)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _rows(cls: type, prefix: str) -> list[tuple[str, Any, str]]:
    rows: list[tuple[str, Any, str]] = []
    docs = _field_docs(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            rows += _rows(type(value), f"{path}.")
            continue
        rows.append((path, value, docs.get(f.name, "")))
    return rows


def render() -> str:
    lines = [_INTRO]
    ray_names = {path: key for key, path in RAY_FILE_KEYS.items()}
    for path, default, doc in _rows(GcsConfig, ""):
        env = [f"`{var}`" for var, p in ENV_VARS.items() if p == path]
        shown = f"`{default!r}`" if default != "" else '`""`'
        meaning = doc.replace("|", "\\|")
        if path in ray_names and ray_names[path] != path:
            meaning += f" File key: `{path}` or Ray's `{ray_names[path]}`."
        lines.append(f"| `{path}` | {', '.join(env) or '—'} | {shown} | {meaning} |\n")
    return "".join(lines)


if __name__ == "__main__":
    print(render(), end="")
