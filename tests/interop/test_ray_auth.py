"""Unmodified Ray 2.60 clients against ``gcs serve --auth-mode token`` (issue 12, item 3).

Ray's own ``GcsClient`` and ``ray.autoscaler.v2.sdk`` with ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN`` read nodes and state, set a constraint and parse the status; without the
token, or with a wrong one, Ray reports our UNAUTHENTICATED answer as its
``AuthenticationError``.  A raylet agent of ours in the same cluster proves the GCS ->
raylet direction carries the token too; a second test runs Ray's client over mutual TLS,
a third compares our answers with Ray's own ``gcs_server`` in token mode (health open).
"""

from __future__ import annotations

import asyncio
import pathlib
import textwrap

import pytest

from tests.interop import venvs
from tests.server.gcs_process import GcsProcess

pytestmark = pytest.mark.interop

TOKEN = "interop-token-0f3a9c"

SCRIPT = textwrap.dedent(
    """
    import json, sys
    address = sys.argv[1]
    try:
        from ray._raylet import GcsClient
        from ray.autoscaler.v2 import sdk

        client = GcsClient(address=address)
        nodes = client.get_all_node_info(timeout=10)
        state = sdk.get_cluster_resource_state(client)
        sdk.request_cluster_resources(address, [{"resources": {"CPU": 1}, "label_selector": {}}])
        status = sdk.get_cluster_status(address)
        out = {
            "ok": True,
            "node_types": sorted(n.node_type_name for n in nodes.values()),
            "version": state.cluster_resource_state_version,
            "idle": sorted(n.ray_node_type_name for n in status.idle_nodes),
        }
    except Exception as exc:
        out = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:600]}
    print(json.dumps(out))
    """
)


def run_ray(venv: venvs.Venv, address: str, env: dict[str, str]) -> dict:
    script = f"import sys; sys.argv = ['x', {address!r}]\n" + SCRIPT
    return venvs.run_in_venv(venv, script, env=env, timeout=120)


async def test_ray_clients_with_and_without_the_token(ray_venv, tmp_path) -> None:
    from gcs.proto import autoscaler_pb2
    from gcs.raylet.agent import RayletAgent, RayletConfig
    from gcs.rpc.descriptors import AUTOSCALER_STATE
    from gcs.rpc.security import Security
    from gcs.sdk._client import AsyncGcsClient
    from tests.conftest import eventually

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    gcs = GcsProcess(
        "memory://",
        extra_args=("--auth-mode", "token", "--auth-token-path", str(token_file)),
        log_path=str(tmp_path / "gcs.log"),
    )
    await asyncio.to_thread(gcs.start)
    agent = RayletAgent(
        RayletConfig(gcs_address=gcs.address, node_type="cpu2", resources={"CPU": 2.0}),
        security=Security.for_server("token", str(token_file)),
    )
    home = str(tmp_path / "home")  # no ~/.ray/auth_token to fall back on
    owner = AsyncGcsClient(gcs.address, security=Security.for_server("token", str(token_file)))

    async def polled_idle() -> bool:
        """The GCS polled the agent (its GetResourceLoad needs the token): node is IDLE."""
        reply = await owner.call(
            AUTOSCALER_STATE,
            "GetClusterResourceState",
            autoscaler_pb2.GetClusterResourceStateRequest(),
        )
        states = reply.cluster_resource_state.node_states
        return [n.status for n in states] == [autoscaler_pb2.NodeStatus.IDLE]

    try:
        await agent.start()
        # wall clock: the GCS's load poll reaching the agent over real gRPC with the token
        await eventually(polled_idle, timeout_s=60, interval_s=0.2)
        good = await asyncio.to_thread(
            run_ray,
            ray_venv,
            gcs.address,
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "HOME": home},
        )
        missing = await asyncio.to_thread(
            run_ray, ray_venv, gcs.address, {"RAY_AUTH_MODE": "disabled", "HOME": home}
        )
        wrong = await asyncio.to_thread(
            run_ray,
            ray_venv,
            gcs.address,
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN + "x", "HOME": home},
        )
    finally:
        await owner.close()
        await agent.stop()
        await asyncio.to_thread(gcs.stop)
    assert good["ok"], good
    assert good["node_types"] == ["cpu2"] and good["idle"] == ["cpu2"]
    assert good["version"] > 0
    for refused in (missing, wrong):
        assert not refused["ok"]
        assert refused["error"] == "AuthenticationError", refused
        assert (
            "InvalidAuthToken: Authentication token is missing or incorrect" in (refused["message"])
        )


async def test_ray_client_over_mutual_tls_with_token(ray_venv, tmp_path, monkeypatch) -> None:
    """RAY_USE_TLS + RAY_TLS_* on both sides (a throwaway CA): Ray's C++ client talks mutual
    TLS with the token to `gcs serve`."""
    import shutil

    from tests.server.test_auth_tls import make_ca_and_node_cert

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    tls = await asyncio.to_thread(make_ca_and_node_cert, tmp_path / "pki")
    for key, value in tls.items():
        monkeypatch.setenv(key, value)  # inherited by the gcs serve subprocess
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    gcs = GcsProcess("memory://", log_path=str(tmp_path / "gcs.log"))
    await asyncio.to_thread(gcs.start)
    try:
        out = await asyncio.to_thread(
            run_ray,
            ray_venv,
            gcs.address,
            {**tls, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "HOME": str(tmp_path)},
        )
    finally:
        await asyncio.to_thread(gcs.stop)
    assert out["ok"], out
    assert out["node_types"] == [] and out["version"] > 0


def _ray_gcs_server_binary(venv: venvs.Venv) -> pathlib.Path:
    found = sorted(venv.path.glob("lib/python3*/site-packages/ray/core/src/ray/gcs/gcs_server"))
    if not found:
        pytest.skip("the Ray wheel has no gcs_server binary")
    return found[0]


def test_same_answers_as_ray_gcs_server_in_token_mode(ray_venv, tmp_path) -> None:
    """Ray 2.60's own gcs_server and ours, both in token mode, give the same status codes:
    health open, GetClusterId refused without / with a wrong token, served with it."""
    import os
    import signal
    import subprocess

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from gcs.proto import gcs_service_pb2 as G
    from gcs.rpc import ServiceStub
    from gcs.rpc.descriptors import NODE_INFO
    from gcs.testing.ports import free_port

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    ray_port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
    ray = subprocess.Popen(
        [
            str(_ray_gcs_server_binary(ray_venv)),
            f"--gcs_server_port={ray_port}",
            "--node_ip_address=127.0.0.2",
            "--session_name=auth_interop",
            f"--session_dir={tmp_path}",
            f"--log_dir={tmp_path}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ours = GcsProcess(
        "memory://", extra_args=("--auth-mode", "token", "--auth-token-path", str(token_file))
    )

    def answers(address: str) -> list[str]:
        out = []
        with grpc.insecure_channel(address) as channel:
            try:
                health = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=5, wait_for_ready=True
                )
                out.append(health_pb2.HealthCheckResponse.ServingStatus.Name(health.status))
            except grpc.RpcError as err:
                out.append(err.code().name)
            for metadata in (
                [],
                [("authorization", "Bearer nope")],
                [("authorization", f"Bearer {TOKEN}")],
            ):
                try:
                    ServiceStub(channel, NODE_INFO, metadata=metadata).GetClusterId(
                        G.GetClusterIdRequest(), timeout=5
                    )
                    out.append("OK")
                except grpc.RpcError as err:
                    out.append(err.code().name)
        return out

    try:
        ours.start()
        theirs = answers(f"127.0.0.1:{ray_port}")
        mine = answers(ours.address)
    finally:
        ours.stop()
        os.killpg(ray.pid, signal.SIGKILL)
        ray.wait(10)
    assert theirs == ["SERVING", "UNAUTHENTICATED", "UNAUTHENTICATED", "OK"]
    assert mine == theirs
