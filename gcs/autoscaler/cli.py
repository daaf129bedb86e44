"""``gcs autoscaler plan``: show the scheduler's decisions, with reasons, for a cluster state."""

from __future__ import annotations

import asyncio
import json

import click
import grpc

from gcs.autoscaler.config import ConfigError, load_cluster_config
from gcs.autoscaler.planner import (
    PlanInputError,
    fetch_state,
    load_state_json,
    plan,
    render_table,
    reply_to_json,
)


@click.group(name="autoscaler")
def autoscaler() -> None:
    """Autoscaler tools."""


@autoscaler.command("plan")
@click.option("--state", "state_path", type=click.Path(), help="ClusterResourceState JSON file.")
@click.option("--from-gcs", "gcs_address", help="Plan against a live GCS at HOST:PORT.")
@click.option("--config", "config_path", type=click.Path(), required=True, help="Cluster YAML.")
@click.option("--now", "now_s", type=float, default=0.0, help="Round time in seconds.")
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="json")
def plan_cmd(
    state_path: str | None, gcs_address: str | None, config_path: str, now_s: float, fmt: str
) -> None:
    """Print launches, terminations and infeasible demand, each with its reason."""
    if (state_path is None) == (gcs_address is None):
        raise click.UsageError("give exactly one of --state or --from-gcs")
    try:
        cluster = load_cluster_config(config_path)
        if state_path is not None:
            state = load_state_json(state_path)
        else:
            state = asyncio.run(fetch_state(gcs_address))  # type: ignore[arg-type]
        doc = reply_to_json(plan(state, cluster, now_s))
    except (ConfigError, PlanInputError) as exc:
        raise click.ClickException(str(exc)) from exc
    except grpc.RpcError as exc:
        raise click.ClickException(
            f"GCS at {gcs_address}: {exc.code().name}: {exc.details()}"
        ) from exc
    click.echo(json.dumps(doc, indent=2) if fmt == "json" else render_table(doc))


if __name__ == "__main__":
    autoscaler()
