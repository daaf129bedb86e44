"""``gcs vcluster create|update|remove|list|show`` (the lead mounts ``vcluster``).

Messages follow ant-ray's ``ray vcluster``; a refusal is one ``Error:`` line on stderr and
exit 1 (with the replica sets the GCS recommends, when it sends some); a bad id or JSON is
exit 2 before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from gcs.base.auth import AuthConfigError
from gcs.cli.support import GcsGroup, dumps, fail
from gcs.cli.support import address_option as shared_address_option
from gcs.cli.support import format_option as shared_format_option
from gcs.cli.validation import NON_NEGATIVE_INT, POSITIVE_INT, strict_json
from gcs.policy.virtual_clusters.ids import id_problem
from gcs.policy.virtual_clusters.messages import NO_ENOUGH_TO_ADD, NO_ENOUGH_TO_REMOVE
from gcs.sdk._vcluster_client import VirtualClusterCallError, VirtualClusterClient

T = TypeVar("T")


def _address(address: str | None) -> str:
    from gcs.cli.support import resolve_address

    return resolve_address(address)


def _call(address: str | None, fn: Callable[[VirtualClusterClient], Awaitable[T]]) -> T:
    async def run() -> T:
        async with VirtualClusterClient(_address(address)) as client:
            return await fn(client)

    try:
        return asyncio.run(run())
    except AuthConfigError as err:  # Ray's auth/TLS environment is misconfigured
        raise click.ClickException(str(err)) from None


def _fail(text: str) -> None:
    """ant-ray's wording, one line on stderr, exit 1."""
    fail(text)


def _refused(what: str, err: VirtualClusterCallError) -> None:
    """The GCS refused: its message, plus the replica sets it recommends when the message
    promises them ("...shown below"), on the one line."""
    text = f"{what}: {err.message}"
    if err.replica_sets_to_recommend:
        sets = json.dumps(err.replica_sets_to_recommend, sort_keys=True)
        text += f" Recommended replica sets: {sets}"
    elif NO_ENOUGH_TO_ADD in err.message or NO_ENOUGH_TO_REMOVE in err.message:
        text += " Recommended replica sets: none (no node of these templates is free)"
    _fail(text)


def _checked_new_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        raise click.BadParameter(problem)
    return value


def _replica_sets(raw: str) -> dict[str, int]:
    try:
        value = strict_json(raw)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--replica-sets") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        raise click.BadParameter(
            'expected a JSON object of template -> count >= 0, e.g. {"4c8g": 2}',
            param_hint="--replica-sets",
        )
    return value


def _cluster_id(positional: str | None, option: str | None) -> str:
    """``show``/``remove`` take the id positionally (ant-ray) or as ``--id`` (like create)."""
    if positional and option and positional != option:
        raise click.UsageError("the cluster id is given twice with different values")
    cluster_id = positional or option
    if not cluster_id:
        raise click.UsageError("missing the virtual cluster id (positional or --id)")
    return cluster_id


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


address_option = shared_address_option("--gcs-address")
format_option = shared_format_option()
_REPLICA_SETS_HELP = 'JSON map of node template -> count, e.g. {"4c8g": 2}.'
_DIVISIBLE_HELP = "Divisible: job clusters can be carved out of it (ant-ray)."


@click.group("vcluster", cls=GcsGroup)
def vcluster() -> None:
    """Manage virtual clusters (ant-ray compatible)."""


@vcluster.command("create")
@click.option(
    "--id",
    "cluster_id",
    required=True,
    callback=_checked_new_id,
    help="The new cluster's id: letters, digits, '-', '_', '.'.",
)
@click.option("--divisible", is_flag=True, default=False, help=_DIVISIBLE_HELP)
@click.option("--replica-sets", "replica_sets", default="{}", help=_REPLICA_SETS_HELP)
@address_option
@format_option
def create(
    cluster_id: str, divisible: bool, replica_sets: str, address: str | None, fmt: str
) -> None:
    """Create a virtual cluster (fails if it exists)."""
    wanted = _replica_sets(replica_sets)

    async def run(client: VirtualClusterClient) -> Any:
        if await client.list(cluster_id):
            raise VirtualClusterCallError(0, "already exists")
        return await client.create_or_update(
            cluster_id, divisible=divisible, replica_sets=wanted, revision=0
        )

    try:
        applied = _call(address, run)
    except VirtualClusterCallError as err:
        _refused(f"Failed to create virtual cluster '{cluster_id}'", err)
        return
    _report_applied(cluster_id, applied, "created", fmt, wanted)


@vcluster.command("update")
@click.option("--id", "cluster_id", required=True, help="The cluster to update.")
@click.option(
    "--divisible/--indivisible",
    default=None,
    help="The cluster's divisibility, fixed at creation: leave both out to keep it.",
)
@click.option("--replica-sets", "replica_sets", default="{}", help=_REPLICA_SETS_HELP)
@click.option(
    "--revision", type=NON_NEGATIVE_INT, required=True, help="The cluster's current revision."
)
@address_option
@format_option
def update(
    cluster_id: str,
    divisible: bool | None,
    replica_sets: str,
    revision: int,
    address: str | None,
    fmt: str,
) -> None:
    """Update a virtual cluster's replica sets (optimistic: pass the current revision).

    Unlike ant-ray's CLI, whose update is its GCS's create-or-update, a missing cluster is
    an error here (it is never created), and the divisibility defaults to the cluster's."""
    wanted = _replica_sets(replica_sets)

    async def run(client: VirtualClusterClient) -> Any:
        current = await client.get(cluster_id)
        if current is None:
            raise VirtualClusterCallError(
                17,
                f"virtual cluster '{cluster_id}' does not exist "
                f"(create it with `gcs vcluster create --id {cluster_id}`)",
            )
        if divisible is not None and divisible != current.divisible:
            kind, flag = ("divisible", "--indivisible")
            if not current.divisible:
                kind, flag = ("indivisible", "--divisible")
            raise VirtualClusterCallError(
                34,
                f"virtual cluster '{cluster_id}' is {kind}, and divisibility is fixed when a "
                f"cluster is created: leave out {flag}",
            )
        return await client.create_or_update(
            cluster_id,
            divisible=current.divisible,
            replica_sets=wanted,
            revision=revision,
            must_exist=True,  # removed since it was read: NotFound, not created again
        )

    try:
        applied = _call(address, run)
    except VirtualClusterCallError as err:
        _refused(f"Failed to update virtual cluster '{cluster_id}'", err)
        return
    _report_applied(cluster_id, applied, "updated", fmt, wanted)


def _waiting_for(applied: Any, wanted: dict[str, int]) -> dict[str, int]:
    """Nodes asked for that the cluster does not have yet: the GCS accepted a request that
    the embedded autoscaler can fill, and it launches them (the cluster's floor)."""
    counts = Counter(t for _h, t in applied.node_instances.values())
    return {t: n - counts[t] for t, n in sorted(wanted.items()) if n > counts[t]}


def _report_applied(
    cluster_id: str, applied: Any, verb: str, fmt: str, wanted: dict[str, int]
) -> None:
    waiting = _waiting_for(applied, wanted)
    if fmt == "json":
        click.echo(
            dumps(
                {
                    "virtual_cluster_id": cluster_id,
                    "revision": applied.revision,
                    "node_instances": {
                        k: {"hostname": h, "template_id": t}
                        for k, (h, t) in applied.node_instances.items()
                    },
                    "waiting_for": waiting,
                },
                sort_keys=True,
            )
        )
        return
    counts = Counter(t for _h, t in applied.node_instances.values())
    click.echo(f"Virtual cluster '{cluster_id}' {verb} successfully")
    click.echo(f"revision: {applied.revision}")
    click.echo(f"replica sets: {json.dumps(dict(sorted(counts.items())))}")
    if waiting:
        click.echo(
            f"waiting for: {json.dumps(waiting)} (the embedded autoscaler launches them and "
            "moves them in; the revision changes then)"
        )


@vcluster.command("remove")
@click.argument("cluster_id", required=False)
@click.option("--id", "id_option", default=None, help="The cluster id (or give it positionally).")
@address_option
@format_option
def remove(cluster_id: str | None, id_option: str | None, address: str | None, fmt: str) -> None:
    """Remove a virtual cluster."""
    cluster_id = _cluster_id(cluster_id, id_option)
    try:
        _call(address, lambda c: c.remove(cluster_id))
    except VirtualClusterCallError as err:
        _refused(f"Failed to remove virtual cluster '{cluster_id}'", err)
        return
    if fmt == "json":
        click.echo(dumps({"virtual_cluster_id": cluster_id, "removed": True}))
        return
    click.echo(f"Virtual cluster '{cluster_id}' removed successfully")


def _row(view: Any) -> dict[str, Any]:
    counts = Counter(v.template_id for v in view.node_instance_views.values())
    return {
        "virtual_cluster_id": view.id,
        "divisible": view.divisible,
        "revision": view.revision,
        "nodes": len(view.node_instance_views),
        "replica_sets": dict(sorted(counts.items())),
    }


@vcluster.command("list")
@click.option("--limit", type=POSITIVE_INT, default=None, help="At most this many clusters.")
@address_option
@format_option
def list_command(limit: int | None, address: str | None, fmt: str) -> None:
    """Every virtual cluster (job clusters and the primary included) with alive nodes."""
    try:
        views, total = _call(address, lambda c: c.show(limit))
    except VirtualClusterCallError as err:
        _fail(f"Failed to list virtual clusters: {err.message}")
        return
    rows = [_row(v) for v in views]
    if fmt == "json":
        click.echo(dumps({"virtual_clusters": rows, "total": total}, sort_keys=True))
        return
    for row in rows:
        row["replica_sets"] = json.dumps(row["replica_sets"])
    click.echo(
        _table(rows, ["virtual_cluster_id", "divisible", "revision", "nodes", "replica_sets"])
    )


@vcluster.command("show")
@click.argument("cluster_id", required=False)
@click.option("--id", "id_option", default=None, help="The cluster id (or give it positionally).")
@address_option
@format_option
def show(cluster_id: str | None, id_option: str | None, address: str | None, fmt: str) -> None:
    """One virtual cluster: revision, autoscaling config and every node."""
    cluster_id = _cluster_id(cluster_id, id_option)
    try:
        views, _total = _call(address, lambda c: c.show())
    except VirtualClusterCallError as err:
        _fail(f"Failed to show virtual cluster '{cluster_id}': {err.message}")
        return
    found = [v for v in views if v.id == cluster_id]
    if not found:
        _fail(f"Virtual cluster '{cluster_id}' does not exist")
        return
    view = found[0]
    nodes = {
        node_id: {
            "hostname": v.hostname,
            "template_id": v.template_id,
            "resources_total": dict(v.resources_total),
            "resources_available": dict(v.resources_available),
        }
        for node_id, v in sorted(view.node_instance_views.items())
    }
    detail = {**_row(view), "node_instances": nodes}
    if fmt == "json":
        click.echo(dumps(detail, sort_keys=True))
        return
    click.echo(f"virtual_cluster_id: {view.id}")
    click.echo(f"divisible: {view.divisible}")
    click.echo(f"revision: {view.revision}")
    click.echo(f"replica_sets: {json.dumps(detail['replica_sets'])}")
    rows = [{"node_id": k, **v} for k, v in nodes.items()]
    if rows:
        click.echo(_table(rows, ["node_id", "hostname", "template_id"]))
