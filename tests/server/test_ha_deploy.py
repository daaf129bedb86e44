"""deploy/kuberay/gcs-ha.yaml: two ``--ha`` GCS pods on Redis, the Service reaching the
ready one only, and readiness that only a leader passes (a standby binds no GCS port)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gcs.config import load_config
from gcs.server.ha_status import LIVENESS_SERVICE

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
    # both roles, on the member's own status port (issue 29 item 5): a stalled member is
    # ended within ~3 s (two missed 1 s probes, then 1 s of grace)
    env = {e["name"]: e.get("value") for e in container["env"]}
    status = int(env["GCS_HA_STATUS_PORT"])
    live = container["livenessProbe"]
    assert live["grpc"] == {"port": status, "service": LIVENESS_SERVICE}
    window_s = live["periodSeconds"] * live["failureThreshold"] + live["timeoutSeconds"]
    assert window_s <= 3 and live["terminationGracePeriodSeconds"] <= 1
    assert container["startupProbe"]["grpc"] == live["grpc"]
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


async def test_the_status_port_answers_liveness_in_both_roles() -> None:
    """The liveness probe's service is SERVING on a standby too (only a stalled or dead
    process fails it); the role stays on the default service."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from gcs.server.ha_status import HaStatusServer

    status = HaStatusServer()
    port = await status.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            check = health_pb2.HealthCheckRequest
            live = await stub.Check(check(service=LIVENESS_SERVICE), timeout=10)
            role = await stub.Check(check(service=""), timeout=10)
    finally:
        await status.close()
    assert live.status == health_pb2.HealthCheckResponse.SERVING
    assert role.status == health_pb2.HealthCheckResponse.NOT_SERVING
