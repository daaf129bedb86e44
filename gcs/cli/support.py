"""What every ``gcs`` command shares: one error policy, the address and format flags.

Error policy: a user error or an unreachable peer is ONE line on stderr and a non-zero exit,
never a traceback.  :class:`GcsGroup` applies it to every command it dispatches, so commands
raise our exceptions (or grpc's) and do not catch them one by one.  ``gcs --debug ...`` (or
``GCS_DEBUG=1``) re-raises instead, traceback included.

Exit codes: 0 ok, 1 the operation failed (peer unreachable, refused, timed out), 2 bad usage
or input (click's own code; every missing or malformed file given as a flag too), 3
``gcs submit --timeout`` struck with tasks still waiting.  Output closed early (``gcs status
--watch | head``) ends the command quietly with 0, as Unix tools end on SIGPIPE.

The GCS address is ``--address``, else ``GCS_ADDRESS``, else ``RAY_ADDRESS``; a malformed
one is blamed on where it came from (``GCS_ADDRESS=garbage: ...``), and every command that
cannot reach it says so the same way: ``cannot reach the GCS at ADDR (CODE: details)``.

``--format text|json`` means the same everywhere, default ``text``: commands are typed by
people (``ray status``, ``kubectl get`` and ``ray list`` default to tables for the same
reason) and a program asks for ``json`` once, explicitly, getting a stable document.
``table`` is accepted as another name for ``text`` (older spellings and ant-ray's).
"""

from __future__ import annotations

import functools
import importlib
import io
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

DEBUG_KEY = "gcs.debug"
DEBUG_ENV = "GCS_DEBUG"
ADDRESS_KEY = "gcs.address"
"""Where the resolved GCS address is kept (the root context's meta) for error messages."""
ADDRESS_ENV_VARS = ("GCS_ADDRESS", "RAY_ADDRESS")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_TIMED_OUT = 3

F = TypeVar("F", bound=Callable[..., Any])


def one_line(text: str) -> str:
    """Collapse whitespace and newlines: an error message is exactly one line."""
    return " ".join(str(text).split()) or "unknown error"


def _current_address() -> str | None:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    value = ctx.find_root().meta.get(ADDRESS_KEY)
    return value if isinstance(value, str) else None


def unreachable(address: str | None, code: str, details: str) -> str:
    """THE sentence for a GCS that does not answer (every command words it this way)."""
    where = f"the GCS at {address}" if address else "the GCS"
    text = f"{code}: {details}" if details else code
    return f"cannot reach {where} ({text})"


def _grpc_code_and_details(exc: Any) -> tuple[Any, str]:
    from gcs.rpc.errors import ray_message  # a Ray-style status's message too

    code = exc.code() if hasattr(exc, "code") else None
    return code, ray_message(exc)


def describe(exc: BaseException, address: str | None = None) -> str:
    """A short, human sentence for an exception raised by a command (no traceback)."""
    import grpc

    from gcs.sdk import GcsSdkError, RpcError

    address = address or _current_address()
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0], address)
    unreached = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    if isinstance(exc, RpcError):
        if exc.status in unreached:
            return unreachable(address, exc.status.name, exc.details)
        return _answered(address, exc.status.name, exc.details)
    if isinstance(exc, GcsSdkError):
        return str(exc)
    from gcs.store.errors import StoreError, StoreUnavailable

    if isinstance(exc, StoreUnavailable):  # an Unavailable too: the store, not the GCS
        return f"cannot reach the store ({exc})"
    from gcs.base.errors import RayletUnreachable, Unavailable

    if isinstance(exc, Unavailable) and not isinstance(exc, RayletUnreachable):  # grpc_gcs.py
        return unreachable(address, "UNAVAILABLE", str(exc).removeprefix("GCS unreachable: "))
    if isinstance(exc, grpc.RpcError):
        code, details = _grpc_code_and_details(exc)
        name = code.name if code is not None else "UNKNOWN"
        if code in unreached:
            return unreachable(address, name, details)
        return _answered(address, name, details)
    if isinstance(exc, TimeoutError):
        return f"timed out{': ' + str(exc) if str(exc) else ''}"
    if isinstance(exc, OSError):
        if exc.strerror and exc.filename:
            return f"{exc.filename}: {exc.strerror}"
        return exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, ValueError):
        return str(exc)
    if isinstance(exc, StoreError):
        return f"store: {exc}"
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message:
        return message
    return f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)"


def _answered(address: str | None, code: str, details: str) -> str:
    who = f"the GCS at {address}" if address else "the GCS"
    return f"{who} answered {code}" + (f": {details}" if details else "")


def _debug_requested(ctx: click.Context) -> bool:
    if ctx.find_root().meta.get(DEBUG_KEY):
        return True
    return os.environ.get(DEBUG_ENV, "").lower() in {"1", "true", "yes"}


_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""click >= 8.2 raises this (a UsageError) for a group called without a command."""


def _quiet_broken_pipe() -> click.exceptions.Exit:
    """Output was closed early (``| head``): exit 0 without a word, as Unix tools do.

    stdout is pointed at /dev/null first so the interpreter's final flush cannot fail again
    ("Exception ignored ... BrokenPipeError").  Returned as click's Exit: click's own main
    would turn the broken pipe into exit 1."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # no real stdout (tests)
        pass
    return click.exceptions.Exit(EXIT_OK)


class GcsGroup(click.Group):
    """A click group whose commands fail with one line, never a traceback (see module doc).

    ``lazy_commands`` names subcommands by ``"module:attribute"``, imported only when the
    command line reaches them (or help lists them): ``gcs status`` does not load the
    autoscaler runtime, the raylet agent and the virtual-cluster client first.  Each
    subsystem's commands live in its own module; the group only names them."""

    _SETTINGS = {"help_option_names": ["-h", "--help"]}

    def __init__(
        self, *args: Any, lazy_commands: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        settings = {**self._SETTINGS, **(kwargs.pop("context_settings", None) or {})}
        super().__init__(*args, context_settings=settings, **kwargs)
        self._lazy = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.get(cmd_name)
        if target is not None:
            module, _, attribute = target.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{target} is not a click command")
            self.add_command(command, cmd_name)
            del self._lazy[cmd_name]
        return super().get_command(ctx, cmd_name)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Like click's, but a usage error is one line too (with a pointer to ``-h``)."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except _NO_ARGS_IS_HELP as err:  # bare `gcs` / `gcs vcluster`: the help, as click does
            err.show()
            sys.exit(err.exit_code)
        except BrokenPipeError:
            sys.exit(_quiet_broken_pipe().exit_code)
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} -h')" if err.ctx is not None else ""
            click.echo(f"Error: {one_line(err.format_message())}{hint}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"Error: {one_line(err.format_message())}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(code if isinstance(code, int) else EXIT_OK)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            raise _quiet_broken_pipe() from None
        except Exception as exc:
            if _debug_requested(ctx):
                raise
            raise click.ClickException(one_line(describe(exc))) from None


def fail(message: str, code: int = EXIT_FAILED) -> None:
    """Print ``message`` as one line on stderr and exit with ``code``."""
    click.echo(f"Error: {one_line(message)}", err=True)
    raise SystemExit(code)


def bad_file(flag: str, err: Exception) -> click.BadParameter:
    """A file given as a flag is missing or malformed: bad input (exit 2), naming the flag."""
    return click.BadParameter(one_line(str(err)), param_hint=flag)


# -- the address flag ---------------------------------------------------------------------------


def resolve_address(address: str | None) -> str:
    """Explicit flag, else ``GCS_ADDRESS``, else ``RAY_ADDRESS``; checked to be host:port.

    ``auto`` means what it means to Ray: the cluster the last ``ray start`` recorded in
    ``<RAY_TMPDIR or /tmp>/ray/ray_current_cluster``.  A dashboard URL (``http://h:8265``,
    what Ray's job docs put in ``RAY_ADDRESS``) or a Ray Client one (``ray://h:10001``)
    names no GCS port, so it is refused with what to use instead.  A malformed value is
    blamed on the source actually used; the result is remembered for the one unreachable
    message."""
    from gcs.cli.validation import check_address

    source, value = "--address", (address or "").strip()
    if not value:
        source = ""
        for name in ADDRESS_ENV_VARS:
            raw = os.environ.get(name, "").strip()
            if raw:
                source, value = name, raw
                break
    if not value:
        raise click.UsageError("no GCS address: pass --address or set GCS_ADDRESS / RAY_ADDRESS")
    given = f"{source}={value}" if source != "--address" else f"--address {value}"
    if value == "auto":
        value = _current_cluster(given)
    problem = _not_a_gcs_address(value)
    if problem:
        raise click.UsageError(f"{given}: {problem}")
    try:
        checked = check_address(value)
    except ValueError as err:
        if source == "--address":
            raise click.BadParameter(f"{value!r}: {err}", param_hint="--address") from None
        raise click.UsageError(f"{source}={value}: {err}") from None
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.find_root().meta[ADDRESS_KEY] = checked
    return checked


def ray_current_cluster_file() -> str:
    """Where Ray's ``ray start`` records the GCS address of the cluster it started (Ray's
    ``get_ray_address_file``: ``RAY_TMPDIR``, else ``TMPDIR`` on Linux, else ``/tmp``)."""
    base = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None
    )
    return os.path.join(base or "/tmp", "ray", "ray_current_cluster")


def _current_cluster(given: str) -> str:
    path = ray_current_cluster_file()
    try:
        with open(path) as file:
            recorded = file.read().strip()
    except FileNotFoundError:
        recorded = ""
    except OSError as err:
        raise click.UsageError(f"{given}: cannot read {path}: {err.strerror or err}") from None
    if not recorded:
        raise click.UsageError(
            f"{given}: no running cluster is recorded in {path} (Ray's `ray start` writes it); "
            "pass --address HOST:PORT or set GCS_ADDRESS"
        )
    return recorded


_URL_KINDS = {
    "http": "the Ray dashboard's HTTP address (what `ray job submit` uses)",
    "https": "the Ray dashboard's HTTP address (what `ray job submit` uses)",
    "ray": "a Ray Client address",
}


def _not_a_gcs_address(value: str) -> str | None:
    """Why ``value`` is a URL of another Ray endpoint, not the GCS's host:port (None: it
    is not such a URL).  The GCS port cannot be derived from it, so say what to pass."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        return None
    kind = _URL_KINDS.get(scheme.lower())
    host = rest.split("/", 1)[0].rsplit(":", 1)[0] or "HOST"
    what = kind or f"a {scheme}:// URL"
    return (
        f"{what}, not the GCS's host:port; pass --address {host}:6379 (the GCS port, Ray's "
        "default 6379) or set GCS_ADDRESS"
    )


ADDRESS_HELP = "GCS host:port (else GCS_ADDRESS, then RAY_ADDRESS)."


def address_option(*legacy: str) -> Callable[[F], F]:
    """``--address`` (else ``GCS_ADDRESS``, ``RAY_ADDRESS``); ``legacy`` spellings are hidden
    aliases (``--gcs-address``, ``--from-gcs``).  The command receives ``address``."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, address: str | None = None, **kwargs: Any) -> Any:
            old = [kwargs.pop(_dest(name), None) for name in legacy]
            given = [v for v in [address, *old] if v]
            if len(set(given)) > 1:
                raise click.UsageError("the address is given twice with different values")
            return fn(*args, address=given[0] if given else None, **kwargs)

        out: Any = wrapper
        for name in legacy:
            out = click.option(name, _dest(name), default=None, hidden=True)(out)
        out = click.option("--address", default=None, help=ADDRESS_HELP)(out)
        return out  # type: ignore[no-any-return]

    return decorate


def _dest(flag: str) -> str:
    return "legacy_" + flag.lstrip("-").replace("-", "_")


class FormatChoice(click.Choice):
    """``text`` | ``json``; ``table`` is accepted as another name for ``text``."""

    ALIASES = {"table": "text"}

    def __init__(self) -> None:
        super().__init__(["text", "json"], case_sensitive=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.lower() in self.ALIASES:
            return self.ALIASES[value.lower()]
        return super().convert(value, param, ctx)


DEFAULT_FORMAT = "text"


def format_option() -> Callable[[F], F]:
    """``--format text|json``, default text everywhere (see the module doc for why)."""
    return click.option(
        "--format",
        "fmt",
        type=FormatChoice(),
        default=DEFAULT_FORMAT,
        show_default=True,
        help="text for people; json for programs (one valid JSON document). 'table' = text.",
    )


def dumps(value: Any, **kwargs: Any) -> str:
    """JSON that is always valid: NaN / Infinity are refused, not emitted."""
    return json.dumps(value, allow_nan=False, **kwargs)


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
