"""``gcs`` command line: serve, status, and the command groups of each subsystem."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import click

from gcs.config import ConfigError, load_config


def resolve_address(address: str | None) -> str:
    """Explicit flag, else ``GCS_ADDRESS``, else ``RAY_ADDRESS`` (the SDK's one resolver)."""
    from gcs.sdk import AddressNotFound
    from gcs.sdk import resolve_address as sdk_resolve

    try:
        return sdk_resolve(address)
    except AddressNotFound:
        raise click.UsageError(
            "no GCS address: pass --address or set GCS_ADDRESS / RAY_ADDRESS"
        ) from None


@click.group()
@click.version_option(package_name="gcs")
def main() -> None:
    """A Ray-wire-compatible control plane (GCS) with virtual clusters and an autoscaler."""


@main.command()
@click.option("--host", default=None, help="Bind address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="gRPC port (default 6379, Ray's).")
@click.option(
    "--storage",
    default=None,
    help="memory://, sqlite:///PATH, postgresql+asyncpg://..., redis://HOST:PORT/DB. "
    "Default: embedded SQLite under --data-dir.",
)
@click.option("--namespace", default=None, help="Key namespace per cluster in a shared store.")
@click.option("--data-dir", default=None, help="Directory for the embedded store.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML config file (flags and GCS_* env vars override it).",
)
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default=None)
@click.option("--log-level", default=None)
@click.option(
    "--metrics-port", type=int, default=None, help="Prometheus port (0 = any free port, -1 = off)."
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
    "--demo",
    "demo_nodes",
    type=int,
    default=0,
    help="Also start N local raylet agents with synthetic load (a demo cluster).",
)
@click.option(
    "--autoscaler-config",
    type=click.Path(),
    default=None,
    help="Cluster YAML: run the embedded autoscaler (a local provider also starts the head).",
)
def serve(
    demo_nodes: int, config_file: str | None, autoscaler_config: str | None, **flags: Any
) -> None:
    """Run the GCS server."""
    from gcs.auth import AuthConfigError
    from gcs.rpc.security import Security
    from gcs.server import GcsServer
    from gcs.server.logging import configure_logging

    try:
        config = load_config(config_file=config_file, flags=flags)
    except ConfigError as err:
        raise click.BadParameter(str(err)) from err
    try:
        security = Security.for_server(
            config.auth_mode,
            config.auth_token_path,
            token_path_what="--auth-token-path" if flags.get("auth_token_path") else "",
        )
    except AuthConfigError as err:
        raise click.ClickException(str(err)) from None
    configure_logging(config.log_format, config.log_level)
    cluster = None
    if autoscaler_config:
        from gcs.autoscaler.config import ConfigError as ClusterConfigError
        from gcs.autoscaler.config import load_cluster_config

        try:
            cluster = load_cluster_config(autoscaler_config)
        except ClusterConfigError as err:
            raise click.ClickException(str(err)) from None

    async def run() -> None:
        server = GcsServer(config, security=security)
        await server.start()
        embedded = None
        if cluster is not None:
            from gcs.autoscaler.runtime import embedded_autoscaler

            embedded = await embedded_autoscaler(server, cluster)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        demo = None
        if demo_nodes:
            from gcs.demo import DemoCluster

            demo = DemoCluster(server.address, nodes=demo_nodes, security=security)
            await demo.start()
        click.echo(
            f"gcs serving on {server.address} (storage {server.store.url}); "
            f"try: gcs status --address {server.address}",
            err=True,
        )
        waiter = asyncio.create_task(server.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if demo is not None:
            await demo.stop()
        if embedded is not None:
            await embedded.stop_embedded()
        await server.stop()
        if waiter.done() and waiter.exception() is not None:
            raise waiter.exception()  # type: ignore[misc]

    asyncio.run(run())


@main.command()
@click.option("--address", default=None, help="GCS address (else GCS_ADDRESS, RAY_ADDRESS).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def status(address: str | None, fmt: str) -> None:
    """Cluster status in the spirit of `ray status`."""
    from google.protobuf import json_format

    from gcs.sdk import GcsSdkError, get_cluster_status
    from gcs.status import render

    try:
        reply = get_cluster_status(address=resolve_address(address))
    except GcsSdkError as err:
        raise click.ClickException(str(err)) from None
    if fmt == "json":
        click.echo(json_format.MessageToJson(reply))
    else:
        click.echo(render(reply), nl=False)


@main.command("request-resources")
@click.option("--address", default=None, help="GCS address (else GCS_ADDRESS, RAY_ADDRESS).")
@click.option("--num-cpus", type=int, default=None, help="Scale to fit this many CPUs.")
@click.option("--bundles", default=None, help='JSON list of resource dicts, e.g. [{"GPU": 1}].')
@click.option(
    "--bundle-label-selectors",
    default=None,
    help='JSON list of label selector dicts, one per bundle, e.g. [{"zone": "a"}].',
)
def request_resources_cmd(
    address: str | None,
    num_cpus: int | None,
    bundles: str | None,
    bundle_label_selectors: str | None,
) -> None:
    """Ask the autoscaler to scale to fit these resources (replaces the previous request)."""
    import json

    from gcs.sdk import GcsSdkError, request_resources

    def parse(text: str | None, flag: str) -> Any:
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise click.BadParameter(f"not valid JSON: {err}", param_hint=flag) from None

    try:
        request_resources(
            num_cpus=num_cpus,
            bundles=parse(bundles, "--bundles"),
            bundle_label_selectors=parse(bundle_label_selectors, "--bundle-label-selectors"),
            address=resolve_address(address),
        )
    except (TypeError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    except GcsSdkError as err:
        raise click.ClickException(str(err)) from None
    click.echo("request_resources constraint set")


def _mount_subcommands() -> None:
    """Each subsystem owns its commands; the top level only mounts them."""
    from gcs.autoscaler.cli import autoscaler
    from gcs.autoscaler.run_cli import run_command, simulate_command
    from gcs.raylet.cli import raylet_command, raylet_fleet_command, submit_command
    from gcs.store.cli import db
    from gcs.virtual_clusters.cli import vcluster

    main.add_command(db)
    autoscaler.add_command(run_command)
    autoscaler.add_command(simulate_command)
    main.add_command(autoscaler)
    main.add_command(vcluster)
    main.add_command(raylet_command)
    main.add_command(raylet_fleet_command)
    main.add_command(submit_command)


_mount_subcommands()

if __name__ == "__main__":
    sys.exit(main())
