"""deploy/grafana-dashboard.json: every query names exported series and is scoped by the
dashboard's ``cluster`` and ``instance`` variables (an HA pair, or two clusters scraped by
one Prometheus, must not mix their series)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gcs.cli.metrics_reference import DOC, documented_table

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
SCOPE = ('cluster=~"$cluster"', 'instance=~"$instance"')
_WORDS = frozenset(
    {"sum", "max", "min", "avg", "rate", "increase", "histogram_quantile", "or", "and"}
)
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")


def _reference_series() -> tuple[set[str], tuple[str, ...]]:
    """Series names the metrics reference (docs/operations.md, generated from the registry
    and checked against it) documents, and the standard collectors' prefixes."""
    names: set[str] = set()
    for name, kind in re.findall(
        r"^\| `([a-z_:0-9]+)` \| (\w+) \|", documented_table(DOC.read_text()), re.M
    ):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    return names, ("process_", "python_")


def _selectors(expr: str) -> list[tuple[str, str]]:
    """(metric, matchers) of every selector in ``expr``; a bare metric name (no braces) is
    returned with empty matchers."""
    found = [(m.group(1), m.group(2)) for m in _SELECTOR.finditer(expr)]
    rest = _SELECTOR.sub(" ", expr)
    rest = re.sub(r"\b(by|without)\s*\([^)]*\)", " ", rest)
    rest = re.sub(r"\[[^\]]*\]|\"[^\"]*\"|\b\d+(\.\d+)?\b", " ", rest)
    for name in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", rest):
        if name not in _WORDS:
            found.append((name, ""))
    return found


def _metric_names(metric: str, matchers: str) -> list[str]:
    """``{__name__=~"a|b", ...}`` names ``a`` and ``b``."""
    if metric:
        return [metric]
    match = re.search(r'__name__=~"([^"]*)"', matchers)
    return match.group(1).split("|") if match else []


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


class TestDashboardScope:
    def test_cluster_and_instance_are_template_variables(self, dashboard) -> None:
        """Both variables are queries over a GCS series, `All` by default (matching series
        with no such label too), the instance list scoped by the chosen cluster."""
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert {"datasource", "cluster", "instance"} <= set(variables)
        reference, _ = _reference_series()
        for name in ("cluster", "instance"):
            var = variables[name]
            assert var["type"] == "query" and var["includeAll"] and var["allValue"] == ".*"
            query = var["query"]["query"]
            assert query.startswith("label_values(") and query.endswith(f", {name})")
            (selector,) = re.findall(r"\{[^}]*\}", query)
            names = _metric_names("", selector)
            assert names and set(names) <= reference, names
        assert 'cluster=~"$cluster"' in variables["instance"]["query"]["query"]

    def test_every_query_filters_on_cluster_and_instance(self, dashboard) -> None:
        """Every selector of every panel query carries both variables' matchers."""
        unscoped = [
            (title, metric or matchers)
            for title, expr in _targets(dashboard)
            for metric, matchers in _selectors(expr)
            if not all(m in matchers for m in SCOPE)
        ]
        assert not unscoped, f"queries not filtered on $cluster/$instance: {unscoped}"
        assert len(_targets(dashboard)) >= 40

    def test_every_queried_metric_is_in_the_metrics_reference(self, dashboard) -> None:
        """Names come from the generated metrics table (the registry's own families)."""
        reference, prefixes = _reference_series()
        unknown = sorted(
            {
                name
                for _title, expr in _targets(dashboard)
                for metric, matchers in _selectors(expr)
                for name in _metric_names(metric, matchers)
                if name not in reference and not name.startswith(prefixes)
            }
        )
        assert not unknown, f"metrics the server does not export: {unknown}"

    def test_ha_actor_placement_group_and_job_panels_chart_their_families(self, dashboard) -> None:
        """Each family of the HA member and of the actor/PG/job managers has a panel."""
        charted = {metric for _title, expr in _targets(dashboard) for metric, _ in _selectors(expr)}
        reference, _ = _reference_series()
        wanted = {n for n in reference if n.startswith("gcs_ha_")} - {
            "gcs_ha_takeover_seconds"  # charted through its _bucket/_sum/_count series
        }
        wanted |= {"gcs_actors", "gcs_placement_groups", "gcs_jobs"}
        assert wanted - charted == set()

    def test_the_checker_catches_an_unscoped_or_unknown_query(self) -> None:
        """The parser sees bare names and missing matchers (the old dashboard's queries)."""
        assert _selectors("sum by (method) (rate(gcs_rpc_total[1m]))") == [("gcs_rpc_total", "")]
        assert _selectors('gcs_a{code!="OK"} or gcs_b') == [
            ("gcs_a", 'code!="OK"'),
            ("gcs_b", ""),
        ]
        assert _selectors(
            'histogram_quantile(0.99, sum by (le) (rate(x_bucket{cluster=~"$cluster"}[5m])))'
        ) == [("x_bucket", 'cluster=~"$cluster"')]
