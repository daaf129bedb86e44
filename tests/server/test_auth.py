"""Token authentication (Ray 2.60's ``RAY_AUTH_MODE=token``): sources, the server check on
every service, the issue-12 defect-2 attacks refused, and our own clients in token mode."""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import types
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gcs.base.auth import AuthConfigError, default_token_path, load_token, parse_mode
from gcs.base.clock import FakeClock
from gcs.config import ConfigError, load_config
from gcs.proto import autoscaler_pb2, gcs_pb2, pubsub_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.rpc.security import Security
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import eventually, fast_config

TOKEN = "0123456789abcdef-secret"
UNAUTH = grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture
def token_file(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


@pytest.fixture
def clean_env(monkeypatch, tmp_path) -> None:
    """No auth/TLS variables from the outer environment; HOME without a token file."""
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_USE_TLS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
async def auth_server(clean_env, token_file) -> AsyncIterator[GcsServer]:
    server = GcsServer(
        fast_config(auth_mode="token", auth_token_path=token_file), store=MemoryStore()
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


# --- where the token comes from -----------------------------------------------------------


class TestTokenSources:
    def test_ray_precedence_env_then_path_then_default(self, tmp_path) -> None:
        """RAY_AUTH_TOKEN beats RAY_AUTH_TOKEN_PATH, which beats ~/.ray/auth_token."""
        home = tmp_path / "home"
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text("from-default\nsecond line\n")
        file = tmp_path / "t"
        file.write_text("  from-file  \n")
        env = {"HOME": str(home), "RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(file)}
        assert load_token(env).value == "from-env"
        assert load_token({**env, "RAY_AUTH_TOKEN": ""}).value == "from-file"
        default = load_token({"HOME": str(home)})
        assert default.value == "from-default"  # first line only, like Ray's loader
        assert default.source == f"default file {home}/.ray/auth_token"
        assert default_token_path({"HOME": "/h"}) == default_token_path({"HOME": "/h/"})

    def test_without_home_the_accounts_home_holds_the_default_file(
        self, tmp_path, monkeypatch
    ) -> None:
        """Ray's tests start drivers with a bare environment (no ``HOME``); Ray's GCS finds
        the token in the account's home then (ours looked in ``./.ray``: the GCS refused
        to start and the driver timed out -- Ray's ``test_output.py::test_spill_logs``)."""
        import gcs.base.auth

        home = tmp_path / "account"
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text("from-account\n")
        account = types.SimpleNamespace(pw_dir=str(home))
        monkeypatch.setattr(gcs.base.auth.pwd, "getpwuid", lambda uid: account)
        for env in ({}, {"HOME": ""}):
            assert default_token_path(env) == home / ".ray" / "auth_token"
            assert load_token(env).value == "from-account"

        def unknown(uid: int) -> object:
            raise KeyError(uid)

        monkeypatch.setattr(gcs.base.auth.pwd, "getpwuid", unknown)
        assert default_token_path({}) == pathlib.Path(".ray/auth_token")

    def test_explicit_path_wins_and_token_never_in_repr(self, tmp_path) -> None:
        file = tmp_path / "t"
        file.write_text(TOKEN)
        token = load_token({"RAY_AUTH_TOKEN": "env"}, explicit_path=str(file))
        assert token.value == TOKEN and TOKEN not in repr(token)
        assert token.matches(f"Bearer {TOKEN}") and not token.matches(f"Bearer {TOKEN}x")
        assert not token.matches(TOKEN)  # the "Bearer " prefix is required, as in Ray

    @pytest.mark.parametrize("content", [None, "", "  \n\n"])
    def test_token_path_unreadable_or_empty_is_fatal_without_fallback(
        self, tmp_path, content
    ) -> None:
        """RAY_AUTH_TOKEN_PATH naming a missing or empty file is an error, even though the
        default file exists (Ray: no silent fallback)."""
        home = tmp_path / "home"
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text("default")
        path = tmp_path / "token"
        if content is not None:
            path.write_text(content)
        with pytest.raises(AuthConfigError, match=r"RAY_AUTH_TOKEN_PATH: .*token"):
            load_token({"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(path)})

    def test_token_mode_without_any_token_names_the_sources(self, tmp_path) -> None:
        with pytest.raises(AuthConfigError, match="RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"):
            load_token({"HOME": str(tmp_path)})

    def test_mode_values(self) -> None:
        assert parse_mode("") == "disabled" and parse_mode("TOKEN") == "token"
        with pytest.raises(AuthConfigError, match="'disabled' or 'token'"):
            parse_mode("tokn")

    def test_config_precedence_flag_env_file(self, tmp_path) -> None:
        """auth_mode: flag > RAY_AUTH_MODE > file; auth_token_path from the file yields to
        Ray's token variables, the flag does not."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text("auth_mode: token\nauth_token_path: /file/token\n")
        assert load_config(config_file=str(cfg), env={}).auth_token_path == "/file/token"
        env = {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x"}
        merged = load_config(config_file=str(cfg), env=env)
        assert merged.auth_mode == "disabled" and merged.auth_token_path == ""
        flagged = load_config(
            config_file=str(cfg),
            env=env,
            flags={"auth_mode": "token", "auth_token_path": "/flag/token"},
        )
        assert flagged.auth_mode == "token" and flagged.auth_token_path == "/flag/token"
        with pytest.raises(ConfigError, match="auth_mode"):
            load_config(env={"RAY_AUTH_MODE": "yes"})


# --- the server check, on every service ----------------------------------------------------

# (service, method, request) -- one representative per service the GCS serves.
REPRESENTATIVES: list[tuple[Any, str, Any]] = [
    (svc.NODE_INFO, "GetClusterId", G.GetClusterIdRequest()),
    (svc.NODE_RESOURCE_INFO, "GetAllAvailableResources", G.GetAllAvailableResourcesRequest()),
    (svc.INTERNAL_KV, "InternalKVGet", G.InternalKVGetRequest(namespace=b"n", key=b"k")),
    (
        svc.AUTOSCALER_STATE,
        "GetClusterResourceState",
        autoscaler_pb2.GetClusterResourceStateRequest(),
    ),
    (svc.JOB_INFO, "GetAllJobInfo", G.GetAllJobInfoRequest()),
    (svc.PLACEMENT_GROUP_INFO, "GetAllPlacementGroup", G.GetAllPlacementGroupRequest()),
    (svc.VIRTUAL_CLUSTER_INFO, "GetVirtualClusters", None),
    (svc.CONTROL_PLANE_PUBSUB, "GcsSubscriberCommandBatch", None),
    (svc.OBSERVABILITY_PUBSUB, "GcsSubscriberCommandBatch", None),
]


def _request(service: Any, method: str, request: Any) -> Any:
    if request is not None:
        return request
    return GetMessageClass(service.methods_by_name[method].input_type)()


async def _code(channel, service, method, request, metadata) -> grpc.StatusCode:
    stub = ServiceStub(channel, service, metadata=metadata, timeout_s=30)
    try:
        await getattr(stub, method)(_request(service, method, request))
    except grpc.aio.AioRpcError as err:
        if err.code() == UNAUTH:
            assert (err.details() or "").startswith("InvalidAuthToken: ")
        return err.code()
    return grpc.StatusCode.OK


class TestServerChecksEveryRpc:
    @pytest.mark.parametrize(
        ("service", "method", "request_"),
        REPRESENTATIVES,
        ids=[f"{s.name}.{m}" for s, m, _ in REPRESENTATIVES],
    )
    async def test_missing_wrong_right_token(self, auth_server, service, method, request_) -> None:
        async with grpc.aio.insecure_channel(auth_server.address) as ch:
            assert await _code(ch, service, method, request_, []) == UNAUTH
            assert await _code(ch, service, method, request_, bearer(TOKEN + "x")) == UNAUTH
            assert await _code(ch, service, method, request_, bearer(TOKEN[:-1])) == UNAUTH
            assert await _code(ch, service, method, request_, [("authorization", TOKEN)]) == UNAUTH
            assert await _code(ch, service, method, request_, bearer(TOKEN)) != UNAUTH

    async def test_pubsub_long_poll_needs_the_token(self, auth_server) -> None:
        """GcsSubscriberPoll is refused at once without the token; with it, it is served
        (answers or is still held when the client gives up)."""
        sub_id = os.urandom(28)
        poll = G.GcsSubscriberPollRequest(subscriber_id=sub_id)
        async with grpc.aio.insecure_channel(auth_server.address) as ch:
            bare = ServiceStub(ch, svc.CONTROL_PLANE_PUBSUB, timeout_s=30)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bare.GcsSubscriberPoll(poll)
            assert info.value.code() == UNAUTH
            good = ServiceStub(ch, svc.CONTROL_PLANE_PUBSUB, metadata=bearer(TOKEN), timeout_s=30)
            batch = G.GcsSubscriberCommandBatchRequest(subscriber_id=sub_id)
            batch.commands.add(channel_type=pubsub_pb2.GCS_NODE_INFO_CHANNEL, subscribe_message={})
            await good.GcsSubscriberCommandBatch(batch)
            try:
                await good.GcsSubscriberPoll(poll, timeout=1.0)
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def test_health_is_open_reflection_is_not(self, auth_server) -> None:
        """Liveness probes carry no credentials: grpc.health.v1 answers without the token
        (Ray's servers do the same); reflection is refused."""
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        async with grpc.aio.insecure_channel(auth_server.address) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)

            async def list_services(metadata) -> Any:
                # Requests from an iterator, not call.write(): a refused stream can end before
                # an explicit write lands, and that write then fails with the client's own
                # INTERNAL "Internal error from Core" instead of the server's status.
                requests = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
                call = refl.ServerReflectionInfo(requests, timeout=5, metadata=metadata)
                return [r async for r in call]

            # The refused call as a unary one: its message goes in the same batch as its
            # headers, so the client cannot race the server's early status into its own
            # INTERNAL "Internal error from Core" (a streaming write can, 1 run in ~100).
            refused = ch.unary_unary(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
            )
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await refused(request.SerializeToString(), timeout=5)
            assert info.value.code() == UNAUTH
            replies = await list_services(bearer(TOKEN))
            assert replies and replies[0].list_services_response.service

    async def test_disabled_by_default_and_logged_once(self, clean_env, capsys) -> None:
        """Off by default like Ray; one start line says so (and never prints a token)."""
        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        try:
            assert server.security.token is None and server.security.tls is None
            async with grpc.aio.insecure_channel(server.address) as ch:
                for service, method, request in REPRESENTATIVES:
                    assert await _code(ch, service, method, request, []) != UNAUTH
        finally:
            await server.stop()

    async def test_start_line_names_the_source_not_the_token(self, auth_server) -> None:
        described = auth_server.security.describe()
        assert described["auth"] == "token" and described["token_source"].endswith("/token")
        assert TOKEN not in repr(described) and TOKEN not in repr(auth_server.security)


# --- issue 12, defect 2: the anonymous attacks -----------------------------------------------


class TestDefect2AttacksRefused:
    async def test_anonymous_writes_are_refused_and_change_nothing(self, auth_server, raylets):
        """Unregister, drain, KV delete, a fake "node DEAD" publish and a far-future
        autoscaler report: all UNAUTHENTICATED without the token, state unchanged."""
        raylet = await raylets()
        node_id = raylet.node_info().node_id
        async with grpc.aio.insecure_channel(auth_server.address) as ch:
            owner = {
                s: ServiceStub(ch, s, metadata=bearer(TOKEN), timeout_s=30)
                for s in (svc.NODE_INFO, svc.INTERNAL_KV, svc.AUTOSCALER_STATE)
            }
            await owner[svc.NODE_INFO].RegisterNode(
                G.RegisterNodeRequest(node_info=raylet.node_info())
            )
            await owner[svc.INTERNAL_KV].InternalKVPut(
                G.InternalKVPutRequest(namespace=b"ns", key=b"k", value=b"v", overwrite=True)
            )
            assert auth_server.managers.autoscaler.autoscaling_state is None
            dead = gcs_pb2.GcsNodeInfo(node_id=node_id, state=gcs_pb2.GcsNodeInfo.DEAD)
            publish = G.GcsPublishRequest()
            publish.pub_messages.add(
                channel_type=pubsub_pb2.GCS_NODE_INFO_CHANNEL,
                key_id=node_id,
                node_info_message=dead,
            )
            attacks = [
                (svc.NODE_INFO, "UnregisterNode", G.UnregisterNodeRequest(node_id=node_id)),
                (svc.NODE_INFO, "DrainNode", G.DrainNodeRequest()),
                (
                    svc.AUTOSCALER_STATE,
                    "DrainNode",
                    autoscaler_pb2.DrainNodeRequest(node_id=node_id, reason=1, reason_message="x"),
                ),
                (
                    svc.INTERNAL_KV,
                    "InternalKVDel",
                    G.InternalKVDelRequest(namespace=b"", key=b"", del_by_prefix=True),
                ),
                (svc.CONTROL_PLANE_PUBSUB, "GcsPublish", publish),
                (
                    svc.AUTOSCALER_STATE,
                    "ReportAutoscalingState",
                    autoscaler_pb2.ReportAutoscalingStateRequest(
                        autoscaling_state=autoscaler_pb2.AutoscalingState(
                            autoscaler_state_version=2**63 - 1
                        )
                    ),
                ),
            ]
            for service, method, request in attacks:
                for metadata in ([], bearer("guess")):
                    assert await _code(ch, service, method, request, metadata) == UNAUTH, method
            nodes = await owner[svc.NODE_INFO].GetAllNodeInfo(G.GetAllNodeInfoRequest())
            got = await owner[svc.INTERNAL_KV].InternalKVGet(
                G.InternalKVGetRequest(namespace=b"ns", key=b"k")
            )
        assert [n.state for n in nodes.node_info_list] == [gcs_pb2.GcsNodeInfo.ALIVE]
        assert node_id not in auth_server.managers.nodes._draining
        assert got.value == b"v"
        assert auth_server.managers.autoscaler.autoscaling_state is None


# --- our clients in token mode ----------------------------------------------------------------


class TestOurClientsSendTheToken:
    async def test_sdk_sync_and_async(self, auth_server, monkeypatch) -> None:
        from gcs.sdk import GcsSdkError, get_cluster_status, get_cluster_status_async

        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
        await asyncio.to_thread(get_cluster_status, address=auth_server.address)
        await get_cluster_status_async(address=auth_server.address)
        monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
        with pytest.raises(GcsSdkError, match="UNAUTHENTICATED"):
            await get_cluster_status_async(address=auth_server.address)
        monkeypatch.delenv("RAY_AUTH_MODE")
        with pytest.raises(GcsSdkError, match="UNAUTHENTICATED"):
            await asyncio.to_thread(get_cluster_status, address=auth_server.address)

    async def test_cli_status_and_request_resources(self, auth_server, monkeypatch) -> None:
        from gcs.cli.main import main

        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
        runner = CliRunner()
        for args in (["status"], ["request-resources", "--num-cpus", "2"]):
            result = await asyncio.to_thread(
                runner.invoke, main, [*args, "--address", auth_server.address], env=env
            )
            assert result.exit_code == 0, result.output
        assert auth_server.managers.autoscaler.constraint is not None
        refused = await asyncio.to_thread(
            runner.invoke, main, ["status", "--address", auth_server.address], env={}
        )
        assert refused.exit_code != 0 and "UNAUTHENTICATED" in refused.output

    async def test_autoscaler_planner_fetch(self, auth_server, monkeypatch) -> None:
        from gcs.autoscaler.planner import fetch_state

        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
        state = await fetch_state(auth_server.address)
        assert state.cluster_session_name

    @pytest.mark.parametrize("transport", ["h2", "grpc"])
    async def test_raylet_agent_both_directions(self, clean_env, token_file, transport) -> None:
        """The agent registers with the token; the GCS's polls (h2 and grpc transports) carry
        it too -- the agent refuses calls without it, as Ray's raylet does in token mode."""
        from gcs.config import LoadPollConfig
        from gcs.proto import node_manager_pb2
        from gcs.raylet.agent import RayletAgent, RayletConfig
        from gcs.rpc.descriptors import NODE_MANAGER

        cfg = fast_config(
            auth_mode="token",
            auth_token_path=token_file,
            load_poll=LoadPollConfig(period_ms=100, timeout_ms=5_000, transport=transport),
        )
        clock = FakeClock()
        server = GcsServer(cfg, store=MemoryStore(), clock=clock)
        await server.start()
        security = Security.for_server("token", token_file)
        agent = RayletAgent(
            RayletConfig(gcs_address=server.address, resources={"CPU": 2.0}), security=security
        )
        try:
            await agent.start()
            stats = server.managers.poller.stats
            await clock.advance_until(lambda: stats.polls_ok >= 3, step_s=0.1)  # 3 periods
            assert stats.polls_failed == 0
            async with grpc.aio.insecure_channel(f"127.0.0.1:{agent.port}") as ch:
                stub = ServiceStub(ch, NODE_MANAGER, timeout_s=30)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.GetResourceLoad(node_manager_pb2.GetResourceLoadRequest())
                assert info.value.code() == UNAUTH
        finally:
            await agent.stop()
            await server.stop()

    def test_misconfigured_client_fails_clearly(self, clean_env, tmp_path, monkeypatch) -> None:
        from gcs.raylet.agent import RayletAgent, RayletConfig
        from gcs.sdk import GcsSdkError, get_cluster_status

        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
        with pytest.raises(AuthConfigError, match="RAY_AUTH_TOKEN_PATH"):
            RayletAgent(RayletConfig(gcs_address="127.0.0.1:1"))
        with pytest.raises(GcsSdkError, match="RAY_AUTH_TOKEN_PATH"):
            get_cluster_status(address="127.0.0.1:1")


# --- misconfiguration fails `gcs serve` at start with one clear line ------------------------


def _serve(env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_AUTH", "RAY_USE_TLS", "RAY_TLS"))
    }
    env.update(env_extra)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gcs.cli.main",
            "serve",
            "--port",
            "0",
            "--storage",
            "memory://",
            "--metrics-port",
            "-1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


class TestServeMisconfiguration:
    @pytest.mark.parametrize(
        ("case", "needle"),
        [
            ("path-missing", "RAY_AUTH_TOKEN_PATH: cannot read token file"),
            ("path-empty", "RAY_AUTH_TOKEN_PATH: token file"),
            ("flag-missing", "--auth-token-path: cannot read token file"),
            ("no-token", "no token"),
            ("tls-unset", "RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY, RAY_TLS_CA_CERT not set"),
            ("tls-missing", "RAY_TLS_SERVER_CERT: cannot read"),
            ("bad-mode", "auth_mode"),
        ],
    )
    def test_fails_at_start_with_one_line(self, tmp_path, case, needle) -> None:
        empty = tmp_path / "empty"
        empty.write_text("\n")
        home = {"HOME": str(tmp_path)}
        token = {**home, "RAY_AUTH_MODE": "token"}
        cases: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
            "path-missing": ({**token, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "nope")}, ()),
            "path-empty": ({**token, "RAY_AUTH_TOKEN_PATH": str(empty)}, ()),
            "flag-missing": (
                {**home, "RAY_AUTH_TOKEN": "x"},
                ("--auth-mode", "token", "--auth-token-path", str(tmp_path / "nope")),
            ),
            "no-token": (token, ()),
            "tls-unset": ({**home, "RAY_USE_TLS": "1"}, ()),
            "tls-missing": (
                {
                    **home,
                    "RAY_USE_TLS": "true",
                    "RAY_TLS_SERVER_CERT": str(tmp_path / "c"),
                    "RAY_TLS_SERVER_KEY": str(tmp_path / "k"),
                    "RAY_TLS_CA_CERT": str(tmp_path / "ca"),
                },
                (),
            ),
            "bad-mode": ({**home, "RAY_AUTH_MODE": "on"}, ()),
        }
        env, args = cases[case]
        proc = _serve(env, *args)
        assert proc.returncode != 0
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert "Traceback" not in proc.stderr
        assert needle in lines[-1], proc.stderr
        if case != "bad-mode":  # config errors print click's usage lines (issue 9's cleanup)
            assert len(lines) == 1, proc.stderr


def test_client_cli_misconfiguration_is_one_line(tmp_path) -> None:
    """raylet, raylet-fleet, vcluster and status stop with one line, not a traceback."""
    from gcs.cli.main import main

    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "nope")}
    commands = (
        ["raylet", "--gcs-address", "127.0.0.1:1"],
        ["raylet-fleet", "--count", "1", "--gcs-address", "127.0.0.1:1"],
        ["vcluster", "list", "--address", "127.0.0.1:1"],
        ["status", "--address", "127.0.0.1:1"],
    )
    for command in commands:
        result = CliRunner().invoke(main, command, env=env)
        assert result.exit_code == 1 and result.exception is not None
        assert "RAY_AUTH_TOKEN_PATH: cannot read token file" in result.output
        assert "Traceback" not in result.output


def test_h2_poll_headers_carry_the_token_after_the_pseudo_headers() -> None:
    """The lean HTTP/2 poll client sends ``authorization`` as a regular header (RFC 9113:
    after every pseudo-header), and nothing when auth is off."""
    import hpack

    from gcs.rpc.raylet_io.h2_grpc import encode_request_headers

    headers = hpack.Decoder().decode(encode_request_headers("/p", "h:1", "Bearer t"))
    names = [name for name, _ in headers]
    assert names[:4] == [":method", ":scheme", ":path", ":authority"]
    assert headers[-1] == ("authorization", "Bearer t")
    plain = hpack.Decoder().decode(encode_request_headers("/p", "h:1"))
    assert "authorization" not in dict(plain)


async def test_serve_flags_alone_secure_the_demo_cluster(clean_env, token_file) -> None:
    """`gcs serve --auth-mode token --auth-token-path F --demo 2` with no RAY_AUTH_* in the
    environment: the demo raylets get the server's token, register and are polled."""
    from gcs.sdk import get_cluster_status_async
    from tests.server.gcs_process import GcsProcess

    gcs = GcsProcess(
        "memory://",
        extra_args=("--auth-mode", "token", "--auth-token-path", token_file, "--demo", "2"),
    )
    await asyncio.to_thread(gcs.start)
    security = Security.for_server("token", token_file)
    try:

        async def two_nodes_reported() -> bool:
            from gcs.sdk._client import AsyncGcsClient

            async with AsyncGcsClient(gcs.address, security=security) as client:
                reply = await client.call(
                    svc.AUTOSCALER_STATE,
                    "GetClusterResourceState",
                    autoscaler_pb2.GetClusterResourceStateRequest(),
                )
            states = reply.cluster_resource_state.node_states
            return len(states) == 2 and all(s.total_resources for s in states)

        # wall clock: a GCS and its demo raylets in another process (time not ours to move)
        await eventually(two_nodes_reported, timeout_s=60, interval_s=0.3)
        from gcs.sdk import GcsSdkError

        with pytest.raises(GcsSdkError, match="UNAUTHENTICATED"):
            await get_cluster_status_async(address=gcs.address)
    finally:
        await asyncio.to_thread(gcs.stop)
