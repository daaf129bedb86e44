"""``gcs autoscaler run``: the standalone autoscaler against any GCS (ours or Ray 2.60's)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import click

from gcs.autoscaler.config import ClusterConfig, ConfigError, load_cluster_config
from gcs.autoscaler.providers.kuberay.k8s import KubeApi
from gcs.autoscaler.runtime import DEFAULT_INTERVAL_S, AutoscalerRuntime
from gcs.cli_support import address_option, bad_file, dumps, format_option, resolve_address


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
    type=click.Choice(["config", "kuberay"]),
    default="config",
    show_default=True,
    help="kuberay: manage the RayCluster --cluster-name (no --config).",
)
@click.option("--cluster-name", default=None, help="kuberay: the RayCluster's name.")
@click.option(
    "--cluster-namespace",
    default=None,
    help="kuberay: its namespace (default: the SA's, else default).",
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
    kube_api = None
    if provider == "kuberay":
        if config_path is not None:
            raise click.UsageError("--provider kuberay reads the RayCluster: drop --config")
        if not cluster_name:
            raise click.UsageError("--provider kuberay needs --cluster-name")
        kube_api = _kube_api(cluster_name, cluster_namespace)
        cluster = _first_read(kube_api)
    else:
        if config_path is None:
            raise click.UsageError("--config is required (or --provider kuberay)")
        try:
            cluster = load_cluster_config(config_path)
        except ConfigError as err:
            raise bad_file("--config", err) from None
    interval = interval_s if interval_s is not None else _interval_default()
    from gcs.auth import AuthConfigError
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
            kube_api=kube_api,
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


def _kube_api(name: str, namespace: str | None) -> KubeApi:
    from gcs.autoscaler.providers.kuberay.k8s import KubernetesApi, load_client_config

    try:
        client, default_ns = load_client_config()
    except Exception as err:  # no service account and no usable kubeconfig
        raise click.ClickException(f"cannot load Kubernetes credentials: {err}") from None
    return KubernetesApi(client, namespace or default_ns, name)


def _first_read(api: KubeApi) -> ClusterConfig:
    from gcs.autoscaler.providers.kuberay.k8s import KubeApiError
    from gcs.autoscaler.providers.kuberay.provider import initial_config

    try:
        return asyncio.run(initial_config(api))
    except KubeApiError as err:
        raise click.ClickException(
            f"RayCluster {api.namespace}/{api.cluster_name}: {err.message or err}"
        ) from None
    except (ConfigError, OSError) as err:
        raise click.ClickException(
            f"RayCluster {api.namespace}/{api.cluster_name}: {err}"
        ) from None


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

    try:
        cluster = load_cluster_config(config_path)
    except ConfigError as err:
        raise bad_file("--config", err) from None
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
