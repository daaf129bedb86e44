"""The Grafana dashboard only charts metrics the server exports (names drift otherwise)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gcs.proto import gcs_service_pb2 as G
from gcs.rpc.services import NODE_INFO
from gcs.sdk import AsyncGcsClient
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
_PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "or", "le", "method", "code", "kind"}


async def test_every_charted_series_is_exported() -> None:
    server = GcsServer(fast_config(metrics_port=0), store=MemoryStore())
    await server.start()
    try:
        async with AsyncGcsClient(server.address) as client:  # one RPC: labelled series exist
            await client.call(NODE_INFO, "GetAllNodeInfo", G.GetAllNodeInfoRequest())
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read())
    finally:
        await server.stop()
    exported = {
        sample.name
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }
    dashboard = json.loads(DASHBOARD.read_text())
    charted = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", "", target["expr"])
            charted |= {w for w in re.findall(r"[a-z_][a-z0-9_]*", expr)} - _PROMQL_WORDS
    missing = sorted(charted - exported)
    assert not missing, f"dashboard charts series the server does not export: {missing}"
    assert len(charted) >= 10
