"""``gcs-server``: our GCS run the way Ray 2.60 runs its ``gcs_server`` binary.

What Ray's side relies on, and what this does about it:

* **stdout / stderr** go to ``--stdout_filepath`` / ``--stderr_filepath`` (Ray passes
  ``<session>/logs/gcs_server.out`` / ``.err``), opened for append before anything is
  printed; our log lines go to stdout, i.e. ``gcs_server.out``, where Ray's GCS logs.
* **the port**: the server binds every interface (``*:<port>``, as Ray's does) on
  ``--gcs_server_port``; with ``0`` it takes a free one.  Either way, once it serves, the
  port is written to ``<session_dir>/gcs_server_port_<node_id>`` (decimal, no newline,
  written whole then renamed): ``ray start --head`` / ``ray.init()`` wait for that file.
* **storage**: Redis when ``--redis_address`` is given (``--redis_port``,
  ``--redis_enable_ssl``, ``--redis_username``, ``--redis_password``), else Ray's
  ``gcs_storage`` (in memory by default: a restarted GCS is a new cluster and raylets of
  the old one exit, Ray's fate-sharing).  See :mod:`gcs.cli.dropin.ray_config`.
* **RayConfig**: ``--config_list`` knobs and ``RAY_<name>`` variables, Ray's precedence;
  the JSON is served to raylets by ``GetInternalConfig``.
* **the head**: nothing virtual; Ray's own head raylet registers with ``is_head_node``.
* **signals**: SIGTERM (what Ray sends) and SIGINT stop the server gracefully, exit 0.
* **the process name** is ``gcs_server``, as the binary's: ``ray stop`` finds the GCS by
  that name (not its command line), and would leave a ``python`` one running.
* **errors**: a bad command line or config is one line on stderr and exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

import gcs
from gcs.base.processes import set_process_name
from gcs.cli.dropin.flags import FlagError, GcsServerFlags, HelpRequested, parse, usage
from gcs.cli.dropin.ray_config import MappedConfig, RayConfigError, map_config
from gcs.config import ConfigError, GcsConfig, load_config
from gcs.store.sql import SQLITE_FILE

PORT_FILE_PREFIX = "gcs_server_port_"
"""Ray's ``GCS_SERVER_PORT_NAME`` + ``_``; the file name ends with the node id (hex)."""
PROCESS_NAME = "gcs_server"
"""The name Ray's binary runs under (``/proc/<pid>/comm``); ``ray stop`` matches it."""
BIND_HOST = "0.0.0.0"
"""Ray's GCS listens on every interface (``::`` when the node's address is IPv6)."""
AUTOSCALER_NAMESPACE = b"__autoscaler"
AUTOSCALER_V2_KEY = b"__autoscaler_v2_enabled"

log = structlog.get_logger("gcs.cli.dropin")


def port_file_path(session_dir: str, node_id: str) -> str:
    return os.path.join(session_dir, PORT_FILE_PREFIX + node_id)


def write_port_file(session_dir: str, node_id: str, port: int) -> str:
    """``<session_dir>/gcs_server_port_<node_id>`` holding the port, replaced atomically
    (a reader polling it never sees a partial number)."""
    path = port_file_path(session_dir, node_id)
    os.makedirs(session_dir, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="ascii") as fh:
        fh.write(str(port))
    os.replace(temporary, path)
    return path


def redirect_stdio(flags: GcsServerFlags) -> None:
    """Point fds 1 and 2 at Ray's log files (append), as Ray's binary redirects its own."""
    for path, fd in ((flags.stdout_filepath, 1), (flags.stderr_filepath, 2)):
        if not path:
            continue
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            (sys.stdout if fd == 1 else sys.stderr).flush()
            os.dup2(target, fd)
        finally:
            os.close(target)


def build_config(flags: GcsServerFlags, mapped: MappedConfig, env: Mapping[str, str]) -> GcsConfig:
    """Ray's command line + knobs as our config (flag precedence over ``GCS_*`` / ``RAY_*``)."""
    overrides: dict[str, Any] = {
        "host": "::" if ":" in flags.node_ip_address else BIND_HOST,
        "port": flags.gcs_server_port,
        "storage": mapped.storage,
        "metrics_port": -1,  # Ray's GCS exports to the metrics agent; it serves no port
        "metrics_agent_port": flags.metrics_agent_port,
        "node_ip_address": flags.node_ip_address,
        "log_format": "console",
        "session_name": flags.session_name or None,
        "ray_internal_config": mapped.raw_json or None,
        "head": False,  # Ray's own head raylet registers as the head
        "dashboard": False,
        "head_raylet": False,
    }
    if mapped.storage.startswith("sqlite"):
        overrides["data_dir"] = mapped.storage.split(":///", 1)[1].removesuffix("/" + SQLITE_FILE)
    overrides.update(mapped.overrides)
    return load_config(env=env, flags=overrides)


def _configure_logging(level: str) -> None:
    from gcs.server.logging import configure_logging

    # our log lines go where Ray's GCS writes its own: stdout (gcs_server.out)
    with contextlib.redirect_stderr(sys.stdout):
        configure_logging("console", level)


async def serve(config: GcsConfig, flags: GcsServerFlags, mapped: MappedConfig) -> None:
    from gcs.server import GcsServer

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = GcsServer(config)
    try:
        await server.start()
        assert server.managers is not None
        await server.managers.kv.put(
            AUTOSCALER_NAMESPACE,
            AUTOSCALER_V2_KEY,
            b"1" if mapped.autoscaler_v2 else b"0",
            overwrite=True,
        )
        port_file = ""
        if flags.session_dir and flags.node_id:
            port_file = await asyncio.to_thread(
                write_port_file, flags.session_dir, flags.node_id, server.port
            )
        log.info(
            "gcs_server.serving",
            port=server.port,
            port_file=port_file or None,
            storage=server.store.url,
            session_name=server.meta.session_name if server.meta else None,
            autoscaler_v2=mapped.autoscaler_v2,
        )
        waiter = asyncio.create_task(server.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stopper.done():
            log.info("gcs_server.stopping", reason="signal")
        for task in (waiter, stopper):
            task.cancel()
        if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
            raise waiter.exception()  # type: ignore[misc]
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gcs-server`` console script."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        flags, _positional = parse(args)
    except HelpRequested as asked:
        if asked.what == "version":
            print(f"gcs-server {gcs.__version__} (Ray {gcs.RAY_VERSION} gcs_server drop-in)")
        else:
            print(usage())
        return 0
    except FlagError as err:
        print(err, file=sys.stderr)
        return 1
    set_process_name(PROCESS_NAME)  # what `ray stop` looks for
    redirect_stdio(flags)
    try:
        mapped = map_config(flags, os.environ)
        config = build_config(flags, mapped, os.environ)
    except (RayConfigError, ConfigError) as err:
        print(f"gcs-server: {err}", file=sys.stderr)
        return 1
    _configure_logging(config.log_level)
    log.info(
        "gcs_server.starting",
        ray_version=gcs.RAY_VERSION,
        ray_commit=flags.ray_commit or None,
        node_id=flags.node_id or None,
        node_ip_address=flags.node_ip_address or None,
        session_dir=flags.session_dir or None,
    )
    if mapped.not_used:
        log.info("ray_config.not_used_by_gcs", knobs=mapped.not_used)
    try:
        asyncio.run(serve(config, flags, mapped))
    except OSError as err:  # the port is taken, a directory cannot be written
        print(f"gcs-server: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        log.exception("gcs_server.failed")
        print(f"gcs-server: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
