"""``gcs ha ...``: operate a ``gcs serve --ha`` group (mounted by gcs/cli/main.py)."""

from __future__ import annotations

import json

import click

from gcs.cli.support import GcsGroup, dumps, fail, format_option, one_line

__all__ = ["ha"]

HANDOVER_TIMEOUT_S = 30.0
"""The leader answers once a successor serves, or after its lease TTL without one."""


@click.group("ha", cls=GcsGroup)
def ha() -> None:
    """Operate an HA group (gcs serve --ha members)."""


@ha.command("handover")
@click.option(
    "--status-address",
    "address",
    required=True,
    help="host:port of the leader's HA status port (ha.status_port).",
)
@click.option(
    "--to", "to", default="", help="Holder name of the standby to take over (default: any)."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=3600),
    default=HANDOVER_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the leader's answer.",
)
@format_option()
def handover_command(address: str, to: str, timeout: float, fmt: str) -> None:
    """Hand the leadership to a standby with no failed call: the leader holds new calls,
    finishes those in flight, hands its lease over and sends its clients to the successor."""
    import grpc

    from gcs.server.ha_status import HANDOVER_METHOD

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(HANDOVER_METHOD)
        try:
            raw = call(json.dumps({"to": to}).encode(), timeout=timeout)
        except grpc.RpcError as err:
            code = err.code().name if hasattr(err, "code") else "UNKNOWN"
            details = err.details() if hasattr(err, "details") else str(err)
            if code == "UNAVAILABLE":
                fail(f"handover: no HA status port answers at {address} ({one_line(details)})")
            fail(f"handover: {address} refused ({code}): {one_line(details or '')}")
            return
    result = json.loads(raw)
    if fmt == "json":
        click.echo(dumps(result))
    elif result.get("handed_over"):
        click.echo(
            f"handed over to {result['successor']} (epoch {result['epoch']}) in "
            f"{result['took_ms']:.0f} ms; {result['refused']} held call(s) sent there"
        )
    else:
        fail("handover: no standby took the lease (the member may lead again)")


@ha.command("finish-upgrade")
@click.option(
    "--storage",
    "url",
    required=True,
    envvar="GCS_STORAGE",
    help="The group's store URL (redis://... or postgresql+asyncpg://...).",
)
@click.option("--namespace", default="default", show_default=True, help="The group's namespace.")
@format_option()
def finish_upgrade_command(url: str, namespace: str, fmt: str) -> None:
    """Contract the store's format to this version's (the last step of a rolling upgrade):
    run it once every member runs this version; older members then refuse to join."""
    import asyncio

    from gcs.config import storage_url_problem
    from gcs.server.logging import configure_logging
    from gcs.store.errors import StoreError
    from gcs.store.factory import open_store
    from gcs.store.format import StoreTooNew, contracted, read_format, write_format

    problem = storage_url_problem(url)
    if problem:
        raise click.BadParameter(problem, param_hint="--storage")
    configure_logging("console", "warning")  # stdout is the answer; the store's logs stay out

    async def finish() -> dict[str, int]:
        # ha: the write feeds the change stream (the standbys see it at once); not fenced
        store = await open_store(url, namespace=namespace, ha=True)
        try:
            found, raw = await read_format(store)
            new = contracted(found)
            if new is not None:
                await write_format(store, new, raw)
                found = new
            return {"version": found.version, "min_reader": found.min_reader}
        finally:
            await store.close()

    try:
        result = asyncio.run(finish())
    except (StoreError, StoreTooNew, ValueError) as err:
        fail(f"finish-upgrade: {one_line(str(err))}")
        return
    if fmt == "json":
        click.echo(dumps(result))
    else:
        click.echo(
            f"store format {result['version']}, readable by format {result['min_reader']} and newer"
        )
