"""What operators read about metrics stays true: the metrics table in docs/operations.md is
the server's registry, and the Grafana dashboard charts only series the server exports and
has panels for the autoscaler and virtual clusters."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gcs.cli.metrics_reference import DOC, collect_families, documented_table, table

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
_PROMQL_WORDS = {"sum", "max", "rate", "increase", "histogram_quantile", "or"}


@pytest.fixture(scope="module")
def exported() -> tuple[list[Any], dict[str, tuple[str, ...]]]:
    """What a GCS with an embedded autoscaler exports (started once for the module)."""
    return asyncio.run(collect_families())


def test_the_docs_table_is_the_registry(
    exported: tuple[list[Any], dict[str, tuple[str, ...]]],
) -> None:
    """Regenerate with `python -m gcs.cli.metrics_reference --write` when this fails."""
    families, labels = exported
    assert documented_table(DOC.read_text()) == table(families, labels)


def test_the_docs_do_not_say_exported_metrics_are_missing() -> None:
    text = DOC.read_text()
    assert "Not yet exported" not in text and "does not run yet" not in text
    for name in ("gcs_syncer_messages_total", "gcs_health_checks_total", "gcs_store_op_seconds"):
        assert f"`{name}`" in text


def _series(expr: str) -> set[str]:
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\b\d+(\.\d+)?\b", "", expr)
    return set(re.findall(r"[a-z_][a-z0-9_]*", expr)) - _PROMQL_WORDS


def test_every_charted_series_is_exported(
    exported: tuple[list[Any], dict[str, tuple[str, ...]]],
) -> None:
    families, _ = exported
    names: set[str] = set()
    for family in families:
        names.add(family.name)
        names |= {s.name for s in family.samples}
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    dashboard = json.loads(DASHBOARD.read_text())
    charted: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            charted |= _series(target["expr"])
    missing = sorted(charted - names)
    assert not missing, f"dashboard charts series the server does not export: {missing}"
    assert len(charted) >= 20


def test_the_dashboard_has_autoscaler_and_virtual_cluster_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == [
        "GCS",
        "High availability (gcs serve --ha)",
        "Actors, placement groups and jobs",
        "Autoscaler",
        "Virtual clusters",
    ]
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for series in (
        "gcs_ha_role",
        "gcs_ha_epoch",
        "gcs_ha_takeovers_total",
        "gcs_ha_step_downs_total",
        "gcs_ha_takeover_seconds_bucket",
        "gcs_actors",
        "gcs_placement_groups",
        "gcs_jobs",
        "gcs_autoscaler_instances",
        "gcs_autoscaler_failed_launches_total",
        "gcs_autoscaler_held_back_node_types",
        "gcs_virtual_clusters",
        "gcs_virtual_cluster_nodes",
    ):
        assert series in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
