"""Click commands: ``raylet``, ``raylet-fleet``, ``submit``.

The lead mounts them into ``gcs/cli/main.py`` (``main.add_command(raylet_command)`` …); they also
run standalone as ``python -m gcs.cli.raylet <command>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import sys
from typing import Any

import click

from gcs.cli.support import (
    EXIT_FAILED,
    EXIT_TIMED_OUT,
    GcsGroup,
    address_option,
    dumps,
    fail,
    format_option,
    unreachable,
)
from gcs.cli.validation import (
    LABELS,
    NODE_ID,
    NON_NEGATIVE_INT,
    PORT_OR_ANY,
    POSITIVE_INT,
    RESOURCES,
    FiniteFloat,
    Validated,
    string_map,
)
from gcs.raylet.agent import ExitReason, RayletAgent, RayletConfig
from gcs.raylet.convert import parse_selector
from gcs.raylet.fleet import FleetConfig, RayletFleet, run_fleet_processes
from gcs.raylet.infeasible import final_message, infeasible_warning, watch_for_verdict
from gcs.raylet.workload import SubmitResult, TaskSpec, submit

FATAL_EXITS = frozenset(
    {ExitReason.DECLARED_DEAD, ExitReason.CLUSTER_CHANGED, ExitReason.GCS_UNREACHABLE}
)
WAITING_NOTICE_AFTER_S = 2.0
"""A registration still waiting after this long says so on stderr (never a silent wait)."""
VERDICT_POLL_S = 2.0
"""How often ``gcs submit`` asks the autoscaler whether infeasible tasks can ever fit."""


def _gcs_address(value: str | None) -> str:
    from gcs.cli.support import resolve_address

    return resolve_address(value)


def _client_logging(level: str = "warning") -> None:
    """Agent logs go to stderr so stdout carries only the command's JSON result."""
    from gcs.server.logging import configure_logging

    configure_logging("auto", level, cache=False)


_log_level_option = click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False),
    default="warning",
    show_default=True,
    help="Agent logs (on stderr).",
)


def _selector(ctx: Any, param: Any, value: str | None) -> dict[str, str]:
    try:
        return string_map(value, "label")
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _check_security() -> None:
    """Ray's auth/TLS environment, checked before anything starts: one line if it is wrong."""
    from gcs.base.auth import AuthConfigError
    from gcs.rpc.security import Security

    try:
        Security.from_env()
    except AuthConfigError as err:
        raise click.ClickException(str(err)) from None


def _signal_event() -> asyncio.Event:
    """An event SIGINT/SIGTERM set; installed before anything starts, so an early signal
    is not lost (nor turned into a KeyboardInterrupt traceback)."""
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, signalled.set)
    return signalled


async def _until_signal(waiter: Any, signalled: asyncio.Event, leave: Any) -> Any:
    """Wait for ``waiter``; on a signal first run ``leave`` (unregister, stop)."""
    wait_task = asyncio.ensure_future(waiter)
    signal_task = asyncio.ensure_future(signalled.wait())
    await asyncio.wait({wait_task, signal_task}, return_when=asyncio.FIRST_COMPLETED)
    if not wait_task.done():
        await leave()
    signal_task.cancel()
    return await wait_task


def _start_error(err: BaseException, address: str, timeout_s: float) -> click.ClickException:
    if isinstance(err, TimeoutError):
        return click.ClickException(
            unreachable(address, "UNAVAILABLE", f"no registration within {timeout_s:g} s")
        )
    if isinstance(err, RuntimeError) and "bind" in str(err).lower():
        return click.ClickException(f"cannot bind the raylet port: {err}".split(";")[0])
    raise err


async def _register(start: Any, address: str, timeout_s: float, signalled: asyncio.Event) -> bool:
    """Run ``start()`` (registration, retried until ``timeout_s``); past
    :data:`WAITING_NOTICE_AFTER_S` say once on stderr what it waits for.  False when
    SIGINT/SIGTERM came first: the registration is abandoned (``start`` cancelled, which
    stops what it started) -- a pod being deleted must not wait for SIGKILL."""
    task = asyncio.ensure_future(start())
    signal_task = asyncio.ensure_future(signalled.wait())
    both = {task, signal_task}
    try:
        if timeout_s > WAITING_NOTICE_AFTER_S:  # a short wait needs no notice
            done, _ = await asyncio.wait(
                both, timeout=WAITING_NOTICE_AFTER_S, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                click.echo(
                    f"Waiting for the GCS at {address} to accept the registration "
                    f"(up to {timeout_s:g} s, --register-timeout)...",
                    err=True,
                )
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        signal_task.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        click.echo(f"Stopped by a signal before the GCS at {address} accepted the registration",
                   err=True)  # fmt: skip
        return False
    try:
        await task
    except (TimeoutError, RuntimeError) as err:
        raise _start_error(err, address, timeout_s) from None
    return True


_gcs_option = address_option("--gcs-address")
_resources_option = click.option(
    "--resources",
    type=RESOURCES,
    default='{"CPU": 1}',
    show_default=True,
    help="JSON map of resource -> amount (finite, >= 0).",
)
_register_timeout_option = click.option(
    "--register-timeout",
    "register_timeout_s",
    type=FiniteFloat(0.0, open_min=True),
    default=30.0,
    show_default=True,
    help="Give up if the GCS has not accepted the registration after this many seconds.",
)


def _ray_seconds_u32(text: str) -> float:
    """Ray's ``uint32`` seconds knob as Ray reads it: a negative integer wraps (-1 = never)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number of seconds, got {text!r}")
    return float(int(value) % (1 << 32)) if value < 0 else value


_reconnect_timeout_option = click.option(
    "--gcs-reconnect-timeout",
    "gcs_reconnect_timeout_s",
    type=Validated("seconds", _ray_seconds_u32),
    envvar="RAY_gcs_rpc_server_reconnect_timeout_s",
    default=60.0,
    show_default=True,
    help="Exit (code 1) once the GCS has been unreachable this many seconds, as Ray's raylet "
    "does (else RAY_gcs_rpc_server_reconnect_timeout_s).",
)

_liveness_option = click.option(
    "--liveness-check-interval-ms",
    type=POSITIVE_INT,
    default=60_000,
    show_default=True,
    help="How often the agent checks that the GCS still knows it (ms).",
)


@click.command("raylet")
@_gcs_option
@_resources_option
@click.option("--node-type", default="", help="GcsNodeInfo.node_type_name.")
@click.option("--labels", type=LABELS, default=None, help="JSON map of node labels (strings).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the agent serves on.")
@click.option("--port", type=PORT_OR_ANY, default=0, help="NodeManagerService port; 0 = free.")
@click.option("--node-name", default="", help="GcsNodeInfo.node_name (default: none).")
@click.option("--instance-id", default="", help="Cloud instance id the autoscaler knows it by.")
@click.option("--node-id", type=NODE_ID, default=None, help="56 hex chars; random when omitted.")
@click.option("--head", is_flag=True, help="Register as the head node.")
@_liveness_option
@click.option("--rejoin-new-cluster", is_flag=True, help="Re-register if the cluster id changes.")
@_register_timeout_option
@_reconnect_timeout_option
@_log_level_option
@format_option()
def raylet_command(
    *,
    fmt: str,
    address: str | None,
    resources: dict[str, float],
    node_type: str,
    labels: dict[str, str] | None,
    host: str,
    port: int,
    node_name: str,
    instance_id: str,
    node_id: bytes | None,
    head: bool,
    liveness_check_interval_ms: int,
    rejoin_new_cluster: bool,
    register_timeout_s: float,
    gcs_reconnect_timeout_s: float,
    log_level: str,
) -> None:
    """Run one lightweight raylet agent until it is drained, shut down or signalled.

    Prints its node id and address on stdout once registered (--format json: a
    {"node_id", "address"} document); logs go to stderr.  SIGINT/SIGTERM unregister the
    node (EXPECTED_TERMINATION) before exiting.
    """
    _check_security()
    gcs_address = _gcs_address(address)
    config = RayletConfig(
        gcs_address=gcs_address,
        resources=resources,
        node_type=node_type,
        labels=labels or {},
        node_id=node_id,
        host=host,
        port=port,
        node_name=node_name,
        instance_id=instance_id,
        is_head=head,
        liveness_check_interval_ms=liveness_check_interval_ms,
        rejoin_new_cluster=rejoin_new_cluster,
        register_timeout_s=register_timeout_s,
        gcs_rpc_server_reconnect_timeout_s=gcs_reconnect_timeout_s,
    )
    _client_logging(log_level)

    async def run() -> tuple[ExitReason, str]:
        signalled = _signal_event()
        agent = RayletAgent(config)
        if not await _register(agent.start, gcs_address, register_timeout_s, signalled):
            return ExitReason.STOPPED, ""
        if fmt == "json":
            click.echo(dumps({"node_id": agent.node_id.hex(), "address": agent.address}))
        else:
            click.echo(
                f"raylet {agent.node_id.hex()} serving at {agent.address}, "
                f"registered with the GCS at {gcs_address}"
            )
        reason = await _until_signal(agent.wait(), signalled, agent.leave)
        return reason, agent.exit_message

    reason, message = asyncio.run(run())
    if reason in FATAL_EXITS:
        fail(message or f"the raylet exited: {reason.value}")


@click.command("raylet-fleet")
@_gcs_option
@click.option("--count", type=POSITIVE_INT, required=True, help="How many raylet agents.")
@_resources_option
@click.option("--node-type", default="", help="GcsNodeInfo.node_type_name of every agent.")
@click.option("--labels", type=LABELS, default=None, help="JSON map of node labels (strings).")
@click.option(
    "--processes",
    type=POSITIVE_INT,
    default=1,
    show_default=True,
    help="Spread the agents over this many child processes.",
)
@click.option("--distinct-ips", is_flag=True, help="Bind agent i to its own 127.x.y.z.")
@click.option(
    "--name-prefix",
    default="fleet",
    show_default=True,
    help="Node names and instance ids are PREFIX-<index>.",
)
@click.option("--first-index", type=NON_NEGATIVE_INT, default=0, hidden=True)
@_liveness_option
@click.option(
    "--syncer/--no-syncer",
    default=True,
    show_default=True,
    help="Keep Ray's syncer stream per agent (resource view on change), as real raylets do.",
)
@_register_timeout_option
@_reconnect_timeout_option
@_log_level_option
@format_option()
def raylet_fleet_command(
    *,
    fmt: str,
    address: str | None,
    count: int,
    resources: dict[str, float],
    node_type: str,
    labels: dict[str, str] | None,
    processes: int,
    distinct_ips: bool,
    name_prefix: str,
    first_index: int,
    liveness_check_interval_ms: int,
    syncer: bool,
    register_timeout_s: float,
    gcs_reconnect_timeout_s: float,
    log_level: str,
) -> None:
    """Run COUNT raylet agents, in this process or spread over --processes children."""
    _check_security()
    gcs_address = _gcs_address(address)
    labels = labels or {}
    _client_logging(log_level)
    if processes > 1:
        argv = [
            "--gcs-address", gcs_address,
            "--resources", json.dumps(resources),
            "--node-type", node_type,
            "--labels", json.dumps(labels),
            "--name-prefix", name_prefix,
            "--liveness-check-interval-ms", str(liveness_check_interval_ms),
            "--register-timeout", repr(register_timeout_s),
            "--gcs-reconnect-timeout", repr(gcs_reconnect_timeout_s),
            "--log-level", log_level, "--format", fmt,
        ]  # fmt: skip
        if distinct_ips:
            argv.append("--distinct-ips")
        if not syncer:
            argv.append("--no-syncer")
        sys.exit(asyncio.run(run_fleet_processes(argv, count, processes)))
    config = FleetConfig(
        gcs_address=gcs_address,
        count=count,
        resources=resources,
        node_type=node_type,
        labels=labels,
        name_prefix=name_prefix,
        first_index=first_index,
        distinct_ips=distinct_ips,
        liveness_check_interval_ms=liveness_check_interval_ms,
        syncer=syncer,
        register_timeout_s=register_timeout_s,
        gcs_rpc_server_reconnect_timeout_s=gcs_reconnect_timeout_s,
    )

    async def run() -> str:
        signalled = _signal_event()
        fleet = RayletFleet(config)
        if not await _register(fleet.start, gcs_address, register_timeout_s, signalled):
            return ""
        if fmt == "json":
            click.echo(dumps({"started": len(fleet.agents)}))
        else:
            click.echo(f"{len(fleet.agents)} raylets registered with the GCS at {gcs_address}")
        reasons = await _until_signal(fleet.wait(), signalled, fleet.leave)
        fatal = [a.exit_message for a, r in zip(fleet.agents, reasons, strict=True)
                 if r in FATAL_EXITS]  # fmt: skip
        return f"{len(fatal)} of {len(reasons)} raylets exited: {fatal[0]}" if fatal else ""

    failed = asyncio.run(run())
    if failed:
        fail(failed)


@click.command("submit")
@address_option("--gcs-address")
@_resources_option
@click.option("--count", type=POSITIVE_INT, default=1, show_default=True, help="How many tasks.")
@click.option(
    "--seconds",
    type=FiniteFloat(0.0),
    default=10.0,
    show_default=True,
    help="How long each task holds its resources once granted.",
)
@click.option("--label-selector", callback=_selector, default=None, help='e.g. {"zone":"in(a,b)"}')
@click.option("--detach", is_flag=True, help="Leave the leases to the raylets and exit at once.")
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(0.0, open_min=True),
    default=None,
    help="Give up waiting after this many seconds (exit code 3 if tasks were still waiting).",
)
@format_option()
def submit_command(
    *,
    fmt: str,
    address: str | None,
    resources: dict[str, float],
    count: int,
    seconds: float,
    label_selector: dict[str, str],
    detach: bool,
    timeout_s: float | None,
) -> None:
    """Place COUNT synthetic tasks, each holding RESOURCES for SECONDS.

    Prints a summary on stdout.  Tasks that fit no alive node are said so at once on stderr
    and wait for the autoscaler to add a node; once the autoscaler reports their shape as
    infeasible (no node type fits) they are withdrawn.  Exit 0 when every task ran (or,
    with --detach, was handed to a raylet); 1 when some can never start or their raylets
    were gone; 3 when --timeout struck first (the summary says how many waited).
    """
    try:
        selector = parse_selector(label_selector)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--label-selector") from None
    task = TaskSpec(resources=resources, seconds=seconds, label_selector=selector)
    gcs_address = _gcs_address(address)
    _client_logging()
    result = asyncio.run(_submit_watching(gcs_address, task, count, detach, timeout_s))
    summary = {
        "placed": dict(result.placed),
        "granted": result.granted,
        "queued": result.queued,
        "infeasible": result.infeasible,
        "rejected": result.rejected,
        "canceled": result.canceled,
        "returned": result.returned,
        "timed_out": result.timed_out,
        "abandoned": result.abandoned,
        "moved": result.moved,
        "unreachable": result.unreachable,
        "ran_on": dict(result.ran_on),
    }
    if fmt == "json":
        click.echo(dumps(summary))
    else:
        click.echo(
            f"{count} tasks of {json.dumps(resources)} on {len(result.placed)} raylets: "
            + ", ".join(f"{k} {v}" for k, v in summary.items() if k not in ("placed", "ran_on"))
        )
    if result.abandoned:
        click.echo(f"Error: {final_message(result.abandoned, count, resources)}", err=True)
        sys.exit(EXIT_FAILED)
    if result.timed_out:
        click.echo(
            f"Error: {result.timed_out} of {count} tasks timed out after {timeout_s:g} s "
            f"({result.granted} granted)",
            err=True,
        )
        sys.exit(EXIT_TIMED_OUT)
    if result.unreachable:
        click.echo(
            f"Error: {result.unreachable} of {count} tasks found their raylet gone "
            f"({result.last_error})",
            err=True,
        )
        sys.exit(EXIT_FAILED)


async def _submit_watching(
    address: str, task: TaskSpec, count: int, detach: bool, timeout_s: float | None
) -> SubmitResult:
    """submit(), warning at once about tasks no alive node fits and withdrawing them once
    the autoscaler declares their shape infeasible (see :mod:`gcs.raylet.infeasible`)."""
    stop = asyncio.Event()
    watchers: list[asyncio.Task[None]] = []

    def placed(result: SubmitResult) -> None:
        if not result.infeasible:
            return
        click.echo(f"Warning: {infeasible_warning(result.infeasible, count, task.resources)}",
                   err=True)  # fmt: skip
        if not detach:
            watchers.append(
                asyncio.ensure_future(
                    watch_for_verdict(address, task.resources, stop, poll_s=VERDICT_POLL_S)
                )
            )

    try:
        return await submit(
            address, task, count, detach=detach, timeout_s=timeout_s, on_placed=placed, stop=stop
        )
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)


@click.group(cls=GcsGroup)
def cli() -> None:
    """Raylet agent commands (standalone entry point)."""


cli.add_command(raylet_command)
cli.add_command(raylet_fleet_command)
cli.add_command(submit_command)

if __name__ == "__main__":
    cli()
