"""What every ``gcs`` command shares: one error policy, the address flag, output helpers.

Error policy: a user error or an unreachable peer is ONE line on stderr and a non-zero exit,
never a traceback.  :class:`GcsGroup` applies it to every command it dispatches, so commands
raise our exceptions (or grpc's) and do not catch them one by one.  ``gcs --debug ...`` (or
``GCS_DEBUG=1``) re-raises instead, traceback included.

Exit codes: 0 ok, 1 the operation failed (peer unreachable, refused, timed out), 2 bad
usage or input (click's own code).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

DEBUG_KEY = "gcs.debug"
DEBUG_ENV = "GCS_DEBUG"

F = TypeVar("F", bound=Callable[..., Any])


def one_line(text: str) -> str:
    """Collapse whitespace and newlines: an error message is exactly one line."""
    return " ".join(str(text).split()) or "unknown error"


def describe(exc: BaseException) -> str:
    """A short, human sentence for an exception raised by a command (no traceback)."""
    import grpc

    from gcs.sdk import GcsSdkError, RpcError

    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0])
    if isinstance(exc, RpcError) and exc.status == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the GCS ({exc.status.name}): {exc.details}"
    if isinstance(exc, GcsSdkError):
        return str(exc)
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else ""
        name = code.name if code is not None else "UNKNOWN"
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"GCS or raylet unreachable ({name}): {details}"
        return f"{name}: {details}"
    if isinstance(exc, TimeoutError):
        return f"timed out{': ' + str(exc) if str(exc) else ''}"
    if isinstance(exc, OSError):
        if exc.strerror and exc.filename:
            return f"{exc.filename}: {exc.strerror}"
        return exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, ValueError):
        return str(exc)
    from gcs.store.errors import StoreError

    if isinstance(exc, StoreError):
        return f"store: {exc}"
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message:
        return message
    return f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)"


def _debug_requested(ctx: click.Context) -> bool:
    if ctx.find_root().meta.get(DEBUG_KEY):
        return True
    return os.environ.get(DEBUG_ENV, "").lower() in {"1", "true", "yes"}


_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""click >= 8.2 raises this (a UsageError) for a group called without a command."""


class GcsGroup(click.Group):
    """A click group whose commands fail with one line, never a traceback (see module doc)."""

    _SETTINGS = {"help_option_names": ["-h", "--help"]}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        settings = {**self._SETTINGS, **(kwargs.pop("context_settings", None) or {})}
        super().__init__(*args, context_settings=settings, **kwargs)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Like click's, but a usage error is one line too (with a pointer to ``-h``)."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except _NO_ARGS_IS_HELP as err:  # bare `gcs` / `gcs vcluster`: the help, as click does
            err.show()
            sys.exit(err.exit_code)
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} -h')" if err.ctx is not None else ""
            click.echo(f"Error: {one_line(err.format_message())}{hint}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"Error: {one_line(err.format_message())}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if _debug_requested(ctx):
                raise
            raise click.ClickException(one_line(describe(exc))) from None


def fail(message: str, code: int = 1) -> None:
    """Print ``message`` as one line on stderr and exit with ``code``."""
    click.echo(f"Error: {one_line(message)}", err=True)
    raise SystemExit(code)


# -- the address flag ---------------------------------------------------------------------------


def resolve_address(address: str | None) -> str:
    """Explicit flag, else ``GCS_ADDRESS``, else ``RAY_ADDRESS``; checked to be host:port."""
    from gcs.cli_validation import check_address
    from gcs.sdk import AddressNotFound
    from gcs.sdk import resolve_address as sdk_resolve

    try:
        value = sdk_resolve(address)
    except AddressNotFound:
        raise click.UsageError(
            "no GCS address: pass --address or set GCS_ADDRESS / RAY_ADDRESS"
        ) from None
    try:
        return check_address(value)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--address") from None


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
        out = click.option(
            "--address", default=None, help="GCS host:port (else GCS_ADDRESS, then RAY_ADDRESS)."
        )(out)
        return out  # type: ignore[no-any-return]

    return decorate


def _dest(flag: str) -> str:
    return "legacy_" + flag.lstrip("-").replace("-", "_")


def format_option(default: str = "text", *, extra: tuple[str, ...] = ()) -> Callable[[F], F]:
    """``--format text|json`` (``extra`` adds old spellings such as ``table`` = text)."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["text", "json", *extra]),
        default=default,
        show_default=True,
        help="text for people, json for programs (always valid JSON).",
    )


def dumps(value: Any, **kwargs: Any) -> str:
    """JSON that is always valid: NaN / Infinity are refused, not emitted."""
    return json.dumps(value, allow_nan=False, **kwargs)


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
