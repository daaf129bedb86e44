"""``gcs autoscaler plan``: show the scheduler's decisions, with reasons, for a cluster state."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click
import grpc

from gcs.auth import AuthConfigError
from gcs.autoscaler.config import ConfigError, load_cluster_config
from gcs.autoscaler.planner import (
    PlanInputError,
    drop_unknown_node_types,
    fetch_state,
    load_state_json,
    parse_ippr_statuses,
    plan,
    render_table,
    reply_to_json,
)
from gcs.autoscaler.scheduler import Options
from gcs.cli_support import (
    GcsGroup,
    address_option,
    dumps,
    format_option,
    one_line,
    resolve_address,
)
from gcs.cli_validation import FiniteFloat


@click.group(name="autoscaler", cls=GcsGroup)
def autoscaler() -> None:
    """Autoscaler tools."""


@autoscaler.command("plan")
@click.option("--state", "state_path", type=click.Path(), help="ClusterResourceState JSON file.")
@address_option("--from-gcs")
@click.option("--config", "config_path", type=click.Path(), required=True, help="Cluster YAML.")
@click.option("--now", "now_s", type=FiniteFloat(0.0), default=0.0, help="Round time in seconds.")
@format_option("json", extra=("table",))
@click.option(
    "--ippr-status",
    "ippr_path",
    type=click.Path(),
    help="JSON {pod name: ray.io/ippr-status fields + current-cpu/current-memory}.",
)
@click.option(
    "--lost-bundle-replacement",
    is_flag=True,
    help="Place a rescheduling group's lost bundles relative to its survivors (ray#40212).",
)
def plan_cmd(
    state_path: str | None,
    address: str | None,
    config_path: str,
    now_s: float,
    fmt: str,
    ippr_path: str | None,
    lost_bundle_replacement: bool,
) -> None:
    """Print launches, terminations and infeasible demand, each with its reason.

    Reads the cluster state from --state FILE, else from the live GCS at --address (or
    GCS_ADDRESS / RAY_ADDRESS).  Live nodes of a type the YAML lacks are left out with a
    warning (in "warnings"; on stderr too) instead of failing the plan.
    """
    if state_path is not None and address is not None:
        raise click.UsageError("give either --state or --address, not both")
    gcs_address = resolve_address(address) if state_path is None else None
    try:
        options = Options(lost_bundle_replacement=lost_bundle_replacement)
        cluster = load_cluster_config(config_path, options)
        statuses = None
        if ippr_path is not None:
            try:
                statuses = parse_ippr_statuses(json.loads(Path(ippr_path).read_text()), ippr_path)
            except (OSError, ValueError) as exc:
                if isinstance(exc, PlanInputError):
                    raise
                raise PlanInputError(f"{ippr_path}: cannot read IPPR statuses ({exc})") from exc
        if state_path is not None:
            state = load_state_json(state_path)
        else:
            state = asyncio.run(fetch_state(gcs_address))  # type: ignore[arg-type]
        state, warnings = drop_unknown_node_types(state, cluster)
        doc = reply_to_json(plan(state, cluster, now_s, statuses))
    except (ConfigError, PlanInputError, AuthConfigError) as exc:
        raise click.ClickException(one_line(str(exc))) from None
    except grpc.RpcError as exc:
        raise click.ClickException(
            one_line(f"GCS at {gcs_address}: {exc.code().name}: {exc.details()}")
        ) from None
    if warnings:
        doc["warnings"] = warnings
        for warning in warnings:
            click.echo(f"Warning: {warning}", err=True)
    click.echo(dumps(doc, indent=2) if fmt == "json" else render_table(doc))


if __name__ == "__main__":
    autoscaler()
