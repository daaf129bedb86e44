"""deploy/kuberay/gcs-ha.yaml: two ``--ha`` GCS pods on Redis, the Service reaching the
ready one only, and readiness that only a leader passes (a standby binds no GCS port)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gcs.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kuberay"


def _docs() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "gcs-ha.yaml").read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_two_ha_replicas_ready_only_as_leader_behind_one_service() -> None:
    docs = _docs()
    gcs = docs[("Deployment", "gcs")]
    assert gcs["spec"]["replicas"] == 2
    (container,) = gcs["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gcs", "serve"]
    args = container["args"]
    assert "--ha" in args
    port = int(next(a for a in args if a.startswith("--port=")).split("=")[1])
    metrics = int(next(a for a in args if a.startswith("--metrics-port=")).split("=")[1])
    assert container["readinessProbe"]["grpc"]["port"] == port  # the leader's port only
    assert container["livenessProbe"]["tcpSocket"]["port"] == metrics  # both roles
    service = docs[("Service", "gcs")]
    assert service["spec"]["selector"] == gcs["spec"]["selector"]["matchLabels"]
    assert not service["spec"].get("publishNotReadyAddresses", False)
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {port, metrics}
    assert ("PodDisruptionBudget", "gcs") not in docs  # only one pod is ever ready


def test_the_pod_command_line_and_environment_are_a_valid_ha_config() -> None:
    (container,) = _docs()[("Deployment", "gcs")]["spec"]["template"]["spec"]["containers"]
    flags: dict[str, Any] = {}
    for arg in container["args"]:
        name, _, value = arg.removeprefix("--").partition("=")
        flags[{"ha": "ha.enabled"}.get(name, name.replace("-", "_"))] = value or True
    env = {e["name"]: e.get("value", "pod-name") for e in container["env"]}
    config = load_config(flags=flags, env=env)
    assert config.ha.enabled and config.storage.startswith("redis://")
    assert config.ha.lease_ttl_ms == 2000 and config.ha.renew_interval_ms == 500
