"""``gcs`` command line: serve, status, and the command groups of each subsystem."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import click
import structlog

from gcs.cli.support import (
    DEBUG_ENV,
    DEBUG_KEY,
    GcsGroup,
    address_option,
    bad_file,
    dumps,
    fail,
    format_option,
    resolve_address,
)
from gcs.cli.validation import METRICS_PORT, NON_NEGATIVE_INT, PORT_OR_ANY, FiniteFloat
from gcs.config import (
    DEFAULT_METRICS_PORT,
    LOG_LEVELS,
    ConfigError,
    load_config,
    storage_url_problem,
)
from gcs.store.errors import StoreUnavailable

CLIENT_TIMEOUT_S = 30.0
"""Deadline of one client call (an unreachable address fails at once, not after this)."""

__all__ = ["main", "resolve_address"]


@click.group(
    cls=GcsGroup,
    lazy_commands={
        "db": "gcs.cli.store:db",
        "ha": "gcs.cli.ha:ha",
        "autoscaler": "gcs.cli.autoscaler:autoscaler",
        "vcluster": "gcs.cli.vcluster:vcluster",
        "raylet": "gcs.cli.raylet:raylet_command",
        "raylet-fleet": "gcs.cli.raylet:raylet_fleet_command",
        "submit": "gcs.cli.raylet:submit_command",
        "install-into-ray": "gcs.cli.dropin.cli:install_into_ray",
    },
)
@click.version_option(package_name="gcs")
@click.option(
    "--debug",
    is_flag=True,
    envvar=DEBUG_ENV,
    help="Show a traceback when a command fails (default: one line on stderr).",
)
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """A Ray-wire-compatible control plane (GCS) with virtual clusters and an autoscaler.

    Every command that talks to a GCS takes --address (else GCS_ADDRESS, then RAY_ADDRESS);
    every command that prints data takes --format text|json (default text).

    Exit codes: 0 ok, 1 the operation failed (unreachable, refused, timed out), 2 bad input
    (flags, files, environment), 3 `gcs submit --timeout` struck with tasks still waiting.
    """
    ctx.meta[DEBUG_KEY] = debug


def _check_storage(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    problem = storage_url_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


@main.command()
@click.option("--host", default=None, help="Bind address (default 127.0.0.1).")
@click.option(
    "--port", type=PORT_OR_ANY, default=None, help="gRPC port (default 6379, Ray's; 0 = any)."
)
@click.option(
    "--storage",
    default=None,
    callback=_check_storage,
    help="memory://, sqlite:///relative/path or sqlite:////absolute/path, "
    "postgresql+asyncpg://USER@HOST/DB, redis://HOST:PORT/DB. "
    "Default: embedded SQLite under --data-dir.",
)
@click.option("--namespace", default=None, help="Key namespace per cluster in a shared store.")
@click.option("--data-dir", default=None, help="Directory for the embedded store.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML config file (flags and GCS_*/RAY_* env vars override it).",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default=None,
    help="Log lines as JSON or key=value (default auto: console on a terminal, else json).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="Least severe log level printed (default info).",
)
@click.option(
    "--metrics-port",
    type=METRICS_PORT,
    default=None,
    help=f"Prometheus port (default {DEFAULT_METRICS_PORT}; 0 = any free port, -1 = off).",
)
@click.option(
    "--auth-mode",
    type=click.Choice(["disabled", "token"], case_sensitive=False),
    default=None,
    help="Ray's token authentication (else RAY_AUTH_MODE; default disabled).",
)
@click.option(
    "--auth-token-path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Token file for --auth-mode token (else RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, "
    "~/.ray/auth_token).",
)
@click.option(
    "--head",
    is_flag=True,
    default=None,
    help="Be the head of a real Ray cluster: `ray start --address` workers join directly.",
)
@click.option(
    "--temp-dir",
    default=None,
    help="The head's temp dir Ray workers default to (default /tmp/ray; with --head).",
)
@click.option(
    "--dashboard",
    is_flag=True,
    default=None,
    help="With --head: run Ray's dashboard (ray list, ray job, web UI), supervised.",
)
@click.option("--dashboard-host", default=None, help="Dashboard bind address (default --host).")
@click.option(
    "--dashboard-port", type=int, default=None, help="Dashboard HTTP port (default 8265)."
)
@click.option(
    "--head-raylet",
    is_flag=True,
    default=None,
    help="With --head: run a real head raylet here (`ray start`); `ray job submit` needs it.",
)
@click.option(
    "--head-raylet-args", default=None, help="Extra `ray start` arguments of the head raylet."
)
@click.option(
    "--ray-python",
    default=None,
    help="Python with ray[default] 2.60 for the dashboard and head raylet (default: this one).",
)
@click.option(
    "--python-version",
    default=None,
    help="Python version Ray processes must run (default: this interpreter's, e.g. 3.11.7).",
)
@click.option(
    "--demo",
    "demo_nodes",
    type=NON_NEGATIVE_INT,
    default=0,
    help="Also start N local raylet agents with synthetic load (a demo cluster).",
)
@click.option(
    "--autoscaler-config",
    type=click.Path(),
    default=None,
    help="Cluster YAML: run the embedded autoscaler (a local provider also starts the head).",
)
@click.option(
    "--ha",
    is_flag=True,
    default=None,
    help="Hot standby: serve while holding the store's lease, else follow the store and take "
    "over when the leader's lease lapses (Redis or PostgreSQL storage; ha.* config keys).",
)
def serve(
    demo_nodes: int, config_file: str | None, autoscaler_config: str | None, **flags: Any
) -> None:
    """Run the GCS server."""
    from gcs.base.auth import AuthConfigError
    from gcs.rpc.security import Security
    from gcs.server import GcsServer
    from gcs.server.event_loop import loop_factory
    from gcs.server.extras import Extras
    from gcs.server.ha_lock import HolderInUse
    from gcs.server.logging import configure_logging
    from gcs.store.factory import redact_url
    from gcs.store.format import StoreTooNew

    flags["ha.enabled"] = flags.pop("ha")
    try:
        config = load_config(
            config_file=config_file,
            flags=flags,
            defaults={"metrics_port": DEFAULT_METRICS_PORT},
        )
        factory = loop_factory(config.event_loop)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    try:
        security = Security.for_server(
            config.auth_mode,
            config.auth_token_path,
            token_path_what="--auth-token-path" if flags.get("auth_token_path") else "",
        )
    except AuthConfigError as err:
        if flags.get("auth_token_path"):  # a file given as a flag: bad input
            raise bad_file("--auth-token-path", err) from None
        raise click.ClickException(str(err)) from None
    cluster = None
    if autoscaler_config:
        from gcs.autoscaler.config import ConfigError as ClusterConfigError
        from gcs.autoscaler.config import load_resolved_cluster_config

        try:
            cluster = asyncio.run(load_resolved_cluster_config(autoscaler_config))
        except ClusterConfigError as err:
            raise bad_file("--autoscaler-config", err) from None
        for warning in cluster.warnings:
            click.echo(f"Warning: {warning}", err=True)
    _check_port_free(config.host, config.port, "--port", shared=config.ha.enabled)
    _check_port_free(config.host, config.metrics_port, "--metrics-port")
    configure_logging(config.log_format, config.log_level)
    log = structlog.get_logger("gcs.cli.main")

    async def run() -> None:
        extras = Extras(autoscaler=cluster, demo_nodes=demo_nodes)
        server = GcsServer(config, security=security, extras=extras)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            try:
                if not await _start_unless_signalled(server.start(), stop):
                    log.info("gcs.stopped_before_serving", reason="signal")
                    return
            except HolderInUse as err:
                raise click.ClickException(str(err)) from None
            except StoreUnavailable as err:
                raise click.ClickException(store_unreachable(config, err)) from None
            if server.ha is not None:  # a member of an HA group: serves once it leads
                log.info("gcs.ha_serve", address=f"{config.host}:{config.port}")
            else:
                log.info(
                    "gcs.serving",
                    address=server.address,
                    storage=redact_url(server.store.url),
                    metrics_port=server.metrics_port or "off",
                    demo_nodes=demo_nodes,
                    autoscaler=cluster.provider.type if cluster is not None else None,
                    hint=f"gcs status --address {server.address}",
                )
            waiter = asyncio.create_task(server.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
        finally:
            await server.stop(hand_over=True)  # a leader hands over to a standby first
        await waiter  # raises what failed, if anything did

    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(run())
    except StoreTooNew as err:  # an HA member on a store in a newer format (a rolling upgrade)
        raise click.ClickException(str(err)) from None


async def _start_unless_signalled(start: Any, stop: asyncio.Event) -> bool:
    """Await ``start`` unless SIGINT/SIGTERM (``stop``) comes first: then cancel it and
    return False.  A GCS waiting for its store stops at once when told to."""
    starting = asyncio.ensure_future(start)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        return False
    await starting  # raises what failed
    return True


def store_unreachable(config: Any, err: StoreUnavailable) -> str:
    """THE sentence for a store ``gcs serve`` could not reach: the store (not the GCS) is
    named, its password redacted, with the retry budget that was spent and its knobs."""
    from gcs.store.errors import StoreUnreachable
    from gcs.store.factory import redact_url

    url = redact_url(config.storage_url())
    detail = str(err)
    for prefix in (url, config.storage_url()):
        detail = detail.removeprefix(f"{prefix}: ")
    detail = detail.rstrip(". ")
    where = "--storage" if config.storage else "the embedded store"
    spent = ""
    if isinstance(err, StoreUnreachable):
        tries = f"{err.attempts} attempt" + ("s" if err.attempts != 1 else "")
        spent = f"; gave up after {tries} in {err.waited_s:.1f} s"
    return (
        f"cannot reach the store {url} ({where}): {detail}{spent} (retry budget: "
        f"RAY_redis_db_connect_retries={config.redis_db_connect_retries} x "
        f"RAY_redis_db_connect_wait_milliseconds={config.redis_db_connect_wait_milliseconds})"
    )


def _check_port_free(host: str, port: int, flag: str, *, shared: bool = False) -> None:
    """Fail before anything starts (or logs) when a fixed port is taken; the server still
    reports a bind failure itself if it loses a race for the port.  ``shared`` (``--ha``):
    members of an HA group on one host share the port (SO_REUSEPORT)."""
    import socket

    if port <= 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise click.BadParameter(f"cannot resolve {host}: {err}", param_hint="--host") from None
    family, kind, proto, _name, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind(sockaddr)
        except OSError as err:
            raise click.ClickException(
                f"{flag} {port}: cannot bind {host}:{port}: {err.strerror or err}"
            ) from None


@main.command()
@address_option()
@format_option()
@click.option(
    "-v", "--verbose", is_flag=True, help="Also every node (like `ray status -v`) and VCs."
)
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option(
    "--interval",
    type=FiniteFloat(0.1),
    default=2.0,
    show_default=True,
    help="Seconds between redraws with --watch (>= 0.1).",
)
def status(address: str | None, fmt: str, verbose: bool, watch: bool, interval: float) -> None:
    """Cluster status in the spirit of `ray status` (-v: per node, virtual clusters)."""
    import time

    from gcs.cli.json_output import message_to_dict
    from gcs.cli.status import render, render_events, render_nodes, render_virtual_clusters
    from gcs.sdk import (
        get_autoscaler_events,
        get_autoscaler_waiting,
        get_cluster_status,
        get_ha_leader,
    )

    resolved = resolve_address(address)
    while True:
        reply = get_cluster_status(address=resolved, timeout_s=CLIENT_TIMEOUT_S)
        clusters = _virtual_cluster_rows(resolved) if verbose else None
        events = get_autoscaler_events(address=resolved, timeout_s=CLIENT_TIMEOUT_S)
        waiting = get_autoscaler_waiting(address=resolved, timeout_s=CLIENT_TIMEOUT_S)
        leader = get_ha_leader(address=resolved, timeout_s=CLIENT_TIMEOUT_S)
        if fmt == "json":
            doc = message_to_dict(reply)
            doc["autoscaler_events"] = events
            if waiting is not None:
                doc["waiting_demand"] = [w.to_json() for w in waiting]
            if leader is not None:
                doc["ha"] = {"role": "leader", **leader}
            if clusters is not None:
                doc["virtual_clusters"] = [
                    {"virtual_cluster_id": c, "divisible": d, "nodes": n, "replica_sets": r}
                    for c, d, n, r in clusters
                ]
            click.echo(dumps(doc, indent=2))
        else:
            text = render(reply, waiting=waiting)
            if verbose:
                text += render_nodes(reply) + render_virtual_clusters(clusters or [])
            text += render_events(events)
            if leader is not None:
                text += (
                    f"GCS: hot-standby group leader {leader.get('holder')} "
                    f"(lease epoch {leader.get('epoch')})\n"
                )
            if watch:
                click.clear()
            click.echo(text, nl=False)
        if not watch:
            return
        time.sleep(interval)


def _virtual_cluster_rows(address: str) -> list[tuple[str, bool, int, dict[str, int]]]:
    from collections import Counter

    from gcs.sdk._vcluster_client import VirtualClusterClient

    async def fetch() -> list[tuple[str, bool, int, dict[str, int]]]:
        async with VirtualClusterClient(address, timeout_s=CLIENT_TIMEOUT_S) as client:
            views, _total = await client.show()
        rows = []
        for view in views:
            counts = Counter(v.template_id for v in view.node_instance_views.values())
            rows.append((view.id, view.divisible, len(view.node_instance_views), dict(counts)))
        return sorted(rows)

    return asyncio.run(fetch())


@main.command("request-resources")
@address_option()
@click.option(
    "--num-cpus",
    type=NON_NEGATIVE_INT,
    default=None,
    help="Scale to fit this many CPUs (0 with no bundles clears the request).",
)
@click.option("--bundles", default=None, help='JSON list of resource dicts, e.g. [{"GPU": 1}].')
@click.option(
    "--bundle-label-selectors",
    default=None,
    help='JSON list of label selector dicts, one per bundle, e.g. [{"zone": "a"}].',
)
@format_option()
def request_resources_cmd(
    address: str | None,
    num_cpus: int | None,
    bundles: str | None,
    bundle_label_selectors: str | None,
    fmt: str,
) -> None:
    """Ask the autoscaler to scale to fit these resources (replaces the previous request)."""
    from gcs.cli.validation import resource_dict, strict_json
    from gcs.sdk import request_resources

    def parse(text: str | None, flag: str) -> Any:
        if text is None:
            return None
        try:
            return strict_json(text)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint=flag) from None

    parsed_bundles = parse(bundles, "--bundles")
    if isinstance(parsed_bundles, list):
        for i, bundle in enumerate(parsed_bundles):
            try:
                resource_dict(bundle)
            except ValueError as err:
                raise click.BadParameter(f"bundle {i}: {err}", param_hint="--bundles") from None
    if num_cpus is None and parsed_bundles is None:
        raise click.UsageError("give --num-cpus and/or --bundles (--num-cpus 0 clears)")
    try:
        request_resources(
            num_cpus=num_cpus,
            bundles=parsed_bundles,
            bundle_label_selectors=parse(bundle_label_selectors, "--bundle-label-selectors"),
            address=resolve_address(address),
            timeout_s=CLIENT_TIMEOUT_S,
        )
    except (TypeError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    outcome = "cleared" if not num_cpus and not parsed_bundles else "set"
    if fmt == "json":
        click.echo(dumps({"constraint": outcome}))
    else:
        click.echo(f"request_resources constraint {outcome}")


@main.command()
@address_option()
@click.option(
    "--service",
    default="",
    help='A served service name (e.g. ray.rpc.NodeInfoGcsService); "" = the whole server.',
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(0.0, open_min=True),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the answer (> 0).",
)
@format_option()
def health(address: str | None, service: str, timeout_s: float, fmt: str) -> None:
    """gRPC health check (grpc.health.v1): prints SERVING and exits 0, else exits 1.

    For container and Kubernetes probes: `gcs health --address 127.0.0.1:6379`.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    resolved = resolve_address(address)
    with grpc.insecure_channel(resolved) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                raise
            fail(
                f"health: the GCS at {resolved} does not serve {service!r} (NOT_FOUND); "
                "name a served service (e.g. ray.rpc.NodeInfoGcsService) or leave --service "
                "out to check the whole server"
            )
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise click.ClickException(f"health: {status}")
    click.echo(dumps({"status": status}) if fmt == "json" else status)


if __name__ == "__main__":
    sys.exit(main())
