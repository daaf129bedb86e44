"""``gcs autoscaler plan``: show the scheduler's decisions, with reasons, for a cluster state."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from gcs.autoscaler.config import ClusterConfig, ConfigError, load_resolved_cluster_config
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
from gcs.autoscaler.providers.registry import PROVIDERS, Registry
from gcs.base.auth import AuthConfigError
from gcs.cli.support import (
    GcsGroup,
    address_option,
    bad_file,
    dumps,
    format_option,
    resolve_address,
)
from gcs.cli.validation import FiniteFloat
from gcs.policy.autoscaling.scheduler import Options


def registry_in_context() -> Registry:
    """The provider registry: the one a caller put in the command line's context (``obj``:
    a test's toy provider), else this build's."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(Registry) if ctx is not None else None
    return found if found is not None else PROVIDERS


def read_cluster_config(
    config_path: str, options: Options | None = None, *, warn: bool = False
) -> ClusterConfig:
    """``--config`` read as Ray reads it: node types' resources filled in by the provider's
    description of their instances; a bad file is one line naming it.  ``warn``: print the
    config's warnings (the keys nothing acts on) to stderr."""
    try:
        cluster = asyncio.run(
            load_resolved_cluster_config(config_path, options, providers=registry_in_context())
        )
    except ConfigError as exc:
        raise bad_file("--config", exc) from None
    if warn:
        for warning in cluster.warnings:
            click.echo(f"Warning: {warning}", err=True)
    return cluster


@click.group(
    name="autoscaler",
    cls=GcsGroup,
    lazy_commands={
        "run": "gcs.cli.autoscaler_run:run_command",
        "simulate": "gcs.cli.autoscaler_run:simulate_command",
    },
)
def autoscaler() -> None:
    """Autoscaler tools."""


@autoscaler.command("plan")
@click.option(
    "--state",
    "state_path",
    type=click.Path(),
    help="ClusterResourceState JSON file (else the live GCS at --address).",
)
@address_option("--from-gcs")
@click.option("--config", "config_path", type=click.Path(), required=True, help="Cluster YAML.")
@click.option("--now", "now_s", type=FiniteFloat(0.0), default=0.0, help="Round time in seconds.")
@format_option()
@click.option(
    "--ippr-status",
    "ippr_path",
    type=click.Path(),
    help="JSON {pod name: ray.io/ippr-status fields + current-cpu/current-memory}.",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Also the raw scores (Ray's score tuple) behind each launch choice.",
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
    verbose: bool,
    lost_bundle_replacement: bool,
) -> None:
    """Print launches, terminations and waiting demand (infeasible / capped / pending
    capacity, per virtual cluster), each with its reason.

    Reads the cluster state from --state FILE, else from the live GCS at --address (or
    GCS_ADDRESS / RAY_ADDRESS).  Live nodes of a type the YAML lacks are left out with a
    warning (in "warnings"; on stderr too) instead of failing the plan.
    """
    if state_path is not None and address is not None:
        raise click.UsageError("give either --state or --address, not both")
    gcs_address = resolve_address(address) if state_path is None else None
    options = Options(lost_bundle_replacement=lost_bundle_replacement)
    cluster = read_cluster_config(config_path, options)
    statuses = None
    if ippr_path is not None:
        try:
            statuses = parse_ippr_statuses(json.loads(Path(ippr_path).read_text()), ippr_path)
        except PlanInputError as exc:
            raise bad_file("--ippr-status", exc) from None
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise bad_file(
                "--ippr-status", ValueError(f"{ippr_path}: cannot read ({why})")
            ) from None
    if state_path is not None:
        try:
            state = load_state_json(state_path)
        except PlanInputError as exc:
            raise bad_file("--state", exc) from None
    else:
        try:
            state = asyncio.run(fetch_state(gcs_address))  # type: ignore[arg-type]
        except AuthConfigError as exc:  # Ray's auth/TLS environment is misconfigured
            raise click.ClickException(str(exc)) from None
    try:
        state, warnings = drop_unknown_node_types(state, cluster)
        doc = reply_to_json(plan(state, cluster, now_s, statuses))
    except PlanInputError as exc:
        where = "--state" if state_path is not None else "--address"
        raise bad_file(where, exc) from None
    warnings = [*cluster.warnings, *warnings]
    if warnings:
        doc["warnings"] = warnings
        for warning in warnings:
            click.echo(f"Warning: {warning}", err=True)
    click.echo(dumps(doc, indent=2) if fmt == "json" else render_table(doc, verbose=verbose))


if __name__ == "__main__":
    autoscaler()
