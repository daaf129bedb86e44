"""``gcs install-into-ray``: make a Ray install start ``gcs-server`` instead of its own GCS."""

from __future__ import annotations

import sys

import click

from gcs.cli.dropin.install import InstallError, install, locate, uninstall
from gcs.cli.support import EXIT_BAD_INPUT, EXIT_FAILED, fail


@click.command("install-into-ray")
@click.option(
    "--ray-python",
    default=None,
    help="The Python of the Ray 2.60 install to change (default: this one).",
)
@click.option(
    "--uninstall",
    "remove",
    is_flag=True,
    help="Put Ray's own gcs_server binary back.",
)
def install_into_ray(ray_python: str | None, remove: bool) -> None:
    """Replace ray/core/src/ray/gcs/gcs_server with a launcher of gcs-server.

    Ray's binary is kept beside it (gcs_server.ray-original); --uninstall restores it.
    Running it again refreshes the launcher.  Then `ray start --head`, `ray.init()` and
    KubeRay head pods run this GCS with Ray's own command line.
    """
    try:
        ray = locate(ray_python or sys.executable)
    except InstallError as err:  # --ray-python names no usable Ray: bad input
        fail(str(err), EXIT_BAD_INPUT)
    try:
        click.echo(uninstall(ray) if remove else install(ray))
    except InstallError as err:
        fail(str(err), EXIT_FAILED)
