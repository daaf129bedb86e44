"""docs/architecture.md's components table is the wiring's component list, in order (the
optional last rows -- the embedded autoscaler and the demo -- come only with their flags)."""

from __future__ import annotations

import pathlib
import re

from tests.conftest import fast_config
from tests.server.wiring_support import built_wiring

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
OPTIONAL_LAST = ["autoscaler", "demo"]  # gcs serve --autoscaler-config / --demo N


def documented_components() -> list[str]:
    section = DOC.read_text().split("## Components", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| \d+ \| (\w+) \|", section, re.MULTILINE)]


def test_the_components_table_is_the_wiring_in_order() -> None:
    wiring = built_wiring(fast_config(metrics_agent_port=0, enable_metrics_collection=True))
    built = [component.name for component in wiring.components]
    assert "event_stats" in built and "metrics_agent" in built
    assert documented_components() == [*built, *OPTIONAL_LAST]
