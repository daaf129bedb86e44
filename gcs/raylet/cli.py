"""Click commands: ``raylet``, ``raylet-fleet``, ``submit``.

The lead mounts them into ``gcs/cli.py`` (``main.add_command(raylet_command)`` …); they also
run standalone as ``python -m gcs.raylet.cli <command>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from typing import Any

import click

from gcs.raylet.agent import ExitReason, RayletAgent, RayletConfig
from gcs.raylet.fleet import FleetConfig, RayletFleet, run_fleet_processes
from gcs.raylet.wire import parse_selector
from gcs.raylet.workload import TaskSpec, submit

FATAL_EXITS = frozenset({ExitReason.DECLARED_DEAD, ExitReason.CLUSTER_CHANGED})


def _gcs_address(value: str | None) -> str:
    from gcs.sdk import AddressNotFound, resolve_address

    try:
        return resolve_address(value)
    except AddressNotFound:
        raise click.UsageError(
            "--gcs-address is required (or set GCS_ADDRESS / RAY_ADDRESS)"
        ) from None


def _check_security() -> None:
    """Ray's auth/TLS environment, checked before anything starts: one line if it is wrong."""
    from gcs.auth import AuthConfigError
    from gcs.rpc.security import Security

    try:
        Security.from_env()
    except AuthConfigError as err:
        raise click.ClickException(str(err)) from None


def _json_dict(ctx: Any, param: Any, value: str | None) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not JSON: {err}") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("expected a JSON object")
    return parsed


def _resources(ctx: Any, param: Any, value: str | None) -> dict[str, float]:
    parsed = _json_dict(ctx, param, value)
    try:
        return {str(k): float(v) for k, v in parsed.items()}
    except (TypeError, ValueError):
        raise click.BadParameter("resource amounts must be numbers") from None


async def _until_signal(waiter: Any, stop: Any) -> Any:
    """Wait for ``waiter``; SIGINT/SIGTERM call ``stop`` first."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, lambda: loop.create_task(stop()))
    return await waiter


_gcs_option = click.option(
    "--gcs-address", default=None, help="GCS host:port (env GCS_ADDRESS, RAY_ADDRESS)."
)
_resources_option = click.option(
    "--resources", callback=_resources, default='{"CPU": 1}', show_default=True, help="JSON map."
)


@click.command("raylet")
@_gcs_option
@_resources_option
@click.option("--node-type", default="", help="GcsNodeInfo.node_type_name.")
@click.option("--labels", callback=_json_dict, default=None, help="JSON map of node labels.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=0, help="0 = a free port.")
@click.option("--node-name", default="")
@click.option("--instance-id", default="")
@click.option("--node-id", default=None, help="56 hex chars; random when omitted.")
@click.option("--head", is_flag=True, help="Register as the head node.")
@click.option("--liveness-check-interval-ms", type=int, default=60_000, show_default=True)
@click.option("--rejoin-new-cluster", is_flag=True, help="Re-register if the cluster id changes.")
def raylet_command(
    *,
    gcs_address: str | None,
    resources: dict[str, float],
    node_type: str,
    labels: dict[str, Any],
    host: str,
    port: int,
    node_name: str,
    instance_id: str,
    node_id: str | None,
    head: bool,
    liveness_check_interval_ms: int,
    rejoin_new_cluster: bool,
) -> None:
    """Run one lightweight raylet agent until it is drained, shut down or signalled."""
    _check_security()
    config = RayletConfig(
        gcs_address=_gcs_address(gcs_address),
        resources=resources,
        node_type=node_type,
        labels={str(k): str(v) for k, v in labels.items()},
        node_id=bytes.fromhex(node_id) if node_id else None,
        host=host,
        port=port,
        node_name=node_name,
        instance_id=instance_id,
        is_head=head,
        liveness_check_interval_ms=liveness_check_interval_ms,
        rejoin_new_cluster=rejoin_new_cluster,
    )

    async def run() -> ExitReason:
        agent = RayletAgent(config)
        await agent.start()
        click.echo(json.dumps({"node_id": agent.node_id.hex(), "address": agent.address}))
        return await _until_signal(agent.wait(), agent.stop)

    reason = asyncio.run(run())
    if reason in FATAL_EXITS:
        sys.exit(1)


@click.command("raylet-fleet")
@_gcs_option
@click.option("--count", type=int, required=True)
@_resources_option
@click.option("--node-type", default="")
@click.option("--labels", callback=_json_dict, default=None)
@click.option("--processes", type=int, default=1, show_default=True)
@click.option("--distinct-ips", is_flag=True, help="Bind agent i to its own 127.x.y.z.")
@click.option("--name-prefix", default="fleet", show_default=True)
@click.option("--first-index", type=int, default=0, hidden=True)
@click.option("--liveness-check-interval-ms", type=int, default=60_000, show_default=True)
def raylet_fleet_command(
    *,
    gcs_address: str | None,
    count: int,
    resources: dict[str, float],
    node_type: str,
    labels: dict[str, Any],
    processes: int,
    distinct_ips: bool,
    name_prefix: str,
    first_index: int,
    liveness_check_interval_ms: int,
) -> None:
    """Run COUNT raylet agents, in this process or spread over --processes children."""
    address = _gcs_address(gcs_address)
    _check_security()
    if processes > 1:
        argv = [
            "--gcs-address", address,
            "--resources", json.dumps(resources),
            "--node-type", node_type,
            "--labels", json.dumps(labels),
            "--name-prefix", name_prefix,
            "--liveness-check-interval-ms", str(liveness_check_interval_ms),
        ]  # fmt: skip
        if distinct_ips:
            argv.append("--distinct-ips")
        sys.exit(asyncio.run(run_fleet_processes(argv, count, processes)))
    config = FleetConfig(
        gcs_address=address,
        count=count,
        resources=resources,
        node_type=node_type,
        labels={str(k): str(v) for k, v in labels.items()},
        name_prefix=name_prefix,
        first_index=first_index,
        distinct_ips=distinct_ips,
        liveness_check_interval_ms=liveness_check_interval_ms,
    )

    async def run() -> None:
        fleet = RayletFleet(config)
        await fleet.start()
        click.echo(json.dumps({"started": len(fleet.agents)}))
        await _until_signal(fleet.wait(), fleet.stop)

    asyncio.run(run())


@click.command("submit")
@click.option("--address", "gcs_address", default=None, help="GCS host:port.")
@_resources_option
@click.option("--count", type=int, default=1, show_default=True)
@click.option("--seconds", type=float, default=10.0, show_default=True)
@click.option("--label-selector", callback=_json_dict, default=None, help='e.g. {"zone":"in(a,b)"}')
@click.option("--detach", is_flag=True, help="Leave the leases to the raylets and exit at once.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Give up waiting after.")
def submit_command(
    *,
    gcs_address: str | None,
    resources: dict[str, float],
    count: int,
    seconds: float,
    label_selector: dict[str, Any],
    detach: bool,
    timeout_s: float | None,
) -> None:
    """Place COUNT synthetic tasks, each holding RESOURCES for SECONDS."""
    task = TaskSpec(
        resources=resources,
        seconds=seconds,
        label_selector=parse_selector({str(k): str(v) for k, v in label_selector.items()}),
    )
    try:
        result = asyncio.run(
            submit(_gcs_address(gcs_address), task, count, detach=detach, timeout_s=timeout_s)
        )
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(
        json.dumps(
            {
                "placed": dict(result.placed),
                "granted": result.granted,
                "queued": result.queued,
                "infeasible": result.infeasible,
                "rejected": result.rejected,
                "canceled": result.canceled,
                "returned": result.returned,
            }
        )
    )


@click.group()
def cli() -> None:
    """Raylet agent commands (standalone entry point)."""


cli.add_command(raylet_command)
cli.add_command(raylet_fleet_command)
cli.add_command(submit_command)

if __name__ == "__main__":
    cli()
