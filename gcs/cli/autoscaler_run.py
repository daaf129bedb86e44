"""``gcs autoscaler run``: the standalone autoscaler against any GCS (ours or Ray 2.60's)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import cast

import click

from gcs.autoscaler.config import (
    CloudConfigReader,
    ClusterConfig,
    ConfigError,
    provider_config,
)
from gcs.autoscaler.providers.registry import PROVIDERS, Registry
from gcs.autoscaler.runtime import DEFAULT_INTERVAL_S, AutoscalerRuntime
from gcs.cli.autoscaler import read_cluster_config, registry_in_context
from gcs.cli.support import address_option, bad_file, dumps, format_option, resolve_address


def _interval_default() -> float:
    raw = os.environ.get("AUTOSCALER_UPDATE_INTERVAL_S")
    if raw is None:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise click.UsageError(f"AUTOSCALER_UPDATE_INTERVAL_S={raw}: not a number") from None
    if not value > 0:
        raise click.UsageError(f"AUTOSCALER_UPDATE_INTERVAL_S={raw}: must be > 0")
    return value


@click.command("run")
@address_option("--gcs-address")
@click.option("--config", "config_path", type=click.Path(), default=None, help="Cluster YAML.")
@click.option(
    "--provider",
    type=click.Choice(["config", *PROVIDERS.cloud_config_types()]),
    default="config",
    show_default=True,
    help="A provider whose cluster config lives in the cloud (kuberay: the RayCluster "
    "--cluster-name), read from there (no --config).",
)
@click.option(
    "--cluster-name",
    default=None,
    help="The cluster in the cloud (provider.cluster_name; kuberay: the RayCluster's name).",
)
@click.option(
    "--cluster-namespace",
    default=None,
    help="Its namespace (provider.namespace; kuberay default: the SA's, else default).",
)
@click.option(
    "--interval-s",
    type=click.FloatRange(min=0.05),
    default=None,
    help="Seconds between rounds (default AUTOSCALER_UPDATE_INTERVAL_S, else 5).",
)
@click.option(
    "--state-dir",
    default=".gcs-data/autoscaler",
    show_default=True,
    help="Where local/command providers remember their processes.",
)
def run_command(
    address: str | None,
    config_path: str | None,
    provider: str,
    cluster_name: str | None,
    cluster_namespace: str | None,
    interval_s: float | None,
    state_dir: str,
) -> None:
    """Reconcile the cluster against CONFIG (or a KubeRay RayCluster) until interrupted
    (instances keep running)."""
    address = resolve_address(address)
    providers = registry_in_context()
    if provider != "config":
        if config_path is not None:
            source = providers[provider].config_source or "its cluster config from the cloud"
            raise click.UsageError(f"--provider {provider} reads {source}: drop --config")
        if not cluster_name:
            raise click.UsageError(f"--provider {provider} needs --cluster-name")
        section = {"type": provider, "cluster_name": cluster_name}
        if cluster_namespace:
            section["namespace"] = cluster_namespace
        cluster = _read_from_cloud(section, providers)
    else:
        if config_path is None:
            cloud = " / ".join(providers.cloud_config_types())
            raise click.UsageError(
                "--config is required" + (f" (or --provider {cloud})" if cloud else "")
            )
        cluster = read_cluster_config(config_path, warn=True)
    interval = interval_s if interval_s is not None else _interval_default()
    from gcs.base.auth import AuthConfigError
    from gcs.rpc.security import Security

    try:
        security = Security.from_env()
    except AuthConfigError as err:
        raise click.ClickException(str(err)) from None

    async def main() -> None:
        runtime = AutoscalerRuntime(
            cluster,
            address,
            state_dir=Path(state_dir),
            interval_s=interval,
            security=security,
            providers=providers,
        )
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await runtime.start()
        click.echo(
            f"autoscaler reconciling {address} every {interval:g} s "
            f"(provider {cluster.provider.type})",
            err=True,
        )
        waiter = asyncio.create_task(runtime.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        await runtime.stop()

    asyncio.run(main())


def _read_from_cloud(section: dict[str, str], providers: Registry) -> ClusterConfig:
    """The cluster config as the provider's cloud holds it (its row's ``cloud_config``)."""
    import pkgutil

    try:
        settings = provider_config(section, {}, providers)
        read = cast(
            "CloudConfigReader", pkgutil.resolve_name(providers[settings.type].cloud_config)
        )
        return asyncio.run(read(settings, None))
    except ConfigError as err:
        raise click.ClickException(str(err)) from None


@click.command("simulate")
@click.option("--config", "config_path", type=click.Path(), required=True, help="Cluster YAML.")
@click.option(
    "--workload", "workload_path", type=click.Path(), required=True, help="Workload YAML."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(),
    default="report",
    show_default=True,
    help="Directory for timeline.png, summary.json/.txt and events.txt.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@format_option()
def simulate_command(
    config_path: str, workload_path: str, out_dir: str, no_progress: bool, fmt: str
) -> None:
    """Run the real reconciler and scheduler against a simulated cloud on a virtual clock;
    write a PNG timeline and a summary to OUT."""
    import logging

    import structlog

    from gcs.autoscaler.simulator import (
        WorkloadError,
        load_workload,
        simulate,
        summary,
        write_report,
    )
    from gcs.autoscaler.simulator.report import summary_text

    cluster = read_cluster_config(config_path, warn=True)
    try:
        workload = load_workload(workload_path)
    except WorkloadError as err:
        raise bad_file("--workload", err) from None
    # Per-round log lines would drown the progress bar: warnings and up only.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    result = asyncio.run(simulate(cluster, workload, progress=not no_progress))
    try:
        files = write_report(result, out_dir)
    except OSError as err:
        raise click.ClickException(f"--out {out_dir}: {err.strerror or err}") from None
    if fmt == "json":
        doc = {"summary": summary(result), "files": {k: str(v) for k, v in files.items()}}
        click.echo(dumps(doc, indent=2))
        return
    click.echo(summary_text(summary(result)))
    click.echo(f"timeline: {files['timeline']}\nsummary:  {files['summary']}")
