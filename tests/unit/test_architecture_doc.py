"""docs/architecture.md is held against the code: its layer table against ``LAYERS``, its
listener table against the order the wiring subscribes them (its component table:
tests/server/test_docs_components.py).  A change to any of them without the document fails."""

from __future__ import annotations

import pathlib
import re

from tests.unit.test_layers import LAYERS

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _table_rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # the header row


def test_the_layer_table_is_layers() -> None:
    rows = _table_rows(_section("Layers"))
    documented = [(row[0], tuple(re.findall(r"`([\w.]+)`", row[1]))) for row in rows]
    assert documented == list(LAYERS)


def _wiring():  # type: ignore[no-untyped-def]
    from tests.server.wiring_support import built_wiring

    return built_wiring()


# The words the document uses for each listener (by the listener's class name; the two
# ``_NodeListener`` rows are told apart by their owner, the wiring's managers).
_LISTENER_WORDS = {
    "ResourceCache": "resource cache",
    "_ForgetRaylet": "raylet client pool (forget)",
    "HealthChecker": "health checker",
    "VirtualClusterManager": "virtual clusters",
    "PlacementGroupScheduler": "placement-group scheduler",
    "AutoscalerStateManager": "autoscaler state",
    "SyncHub": "syncer hub",
    "TaskFailureMarker": "task-failure marker",
    "RuntimeEnvPins": "runtime-env pins",
}


def _words(wiring: object, listeners: object) -> list[str]:
    managers = wiring.managers  # type: ignore[attr-defined]
    owners = {
        id(getattr(getattr(managers, name), attr, None)): name
        for name in ("jobs", "actors")
        for attr in ("node_listener", "job_listener", "worker_listener")
    }
    out = []
    for listener in listeners:  # type: ignore[attr-defined]
        owner = owners.get(id(listener))
        out.append(owner if owner else _LISTENER_WORDS[type(listener).__name__])
    return out


def _documented_listeners() -> dict[str, list[str]]:
    rows = _table_rows(_section("Events and the order of their listeners"))
    out = {}
    for event, listeners in rows:
        kind = event.split("(")[0].strip()
        # "jobs (a dead driver's jobs finish)": the words before the parenthesis name it,
        # unless the parenthesis is the name itself ("raylet client pool (forget)")
        names = []
        for raw in listeners.split(" -> "):
            part = raw.strip()
            names.append(part if part.endswith("(forget)") else part.split(" (")[0].strip())
        out[kind] = names
    return out


def test_the_listener_table_is_the_wiring_order() -> None:
    wiring = _wiring()
    documented = _documented_listeners()
    assert documented == {
        "node added / dead": _words(wiring, wiring.node_events),
        "job check / finished": _words(wiring, wiring.job_events),
        "placement group created / removed": _words(wiring, wiring.pg_events),
        "worker dead": _words(wiring, wiring.worker_events),
    }
