"""Ray 2.60 ``gcs_server``'s command line, parsed as gflags parses it.

Ray's binary defines its flags with gflags (``src/ray/gcs/gcs_server_main.cc``); its
Python side passes ``--name=value`` (``services.start_gcs_server``), but anything that
gflags accepts must work here too: one or two leading dashes, ``--name value`` for
non-boolean flags, ``--name`` / ``--noname`` / ``--name=false`` for booleans, dashes and
underscores alike in names (``--metrics-agent-port``), ``--`` ending the flags, the last
occurrence winning, and ``--undefok=a,b`` to let unknown ``--a=...`` pass.  An unknown
flag or a bad value is refused with gflags' own wording (one line, exit 1).  argparse
cannot express single-dash long names or the ``--no`` prefix, hence this small parser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

FlagType = Literal["string", "int32", "bool"]


class FlagError(ValueError):
    """The command line is not one Ray's ``gcs_server`` accepts (message: gflags' words)."""


class HelpRequested(Exception):
    """``--help`` (or a gflags help variant) or ``--version`` was given."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True, slots=True)
class GcsServerFlags:
    """Ray 2.60 ``gcs_server``'s flags, with its defaults (``gcs_server --help``)."""

    redis_address: str = ""
    """The ip address of redis (empty: no Redis; Ray's in-memory storage)."""
    redis_enable_ssl: bool = False
    redis_port: int = -1
    log_dir: str = ""
    """Where Ray's GCS writes its event logs (``<log_dir>/events``)."""
    stdout_filepath: str = ""
    """Where stdout goes (Ray's ``logs/gcs_server.out``; our log lines too)."""
    stderr_filepath: str = ""
    """Where stderr goes (``logs/gcs_server.err``)."""
    gcs_server_port: int = 0
    """0: choose a free port and write it to ``<session_dir>/gcs_server_port_<node_id>``."""
    metrics_agent_port: int = -1
    config_list: str = ""
    """Base64 of a JSON object of RayConfig overrides."""
    redis_username: str = ""
    redis_password: str = ""
    retry_redis: bool = False
    node_ip_address: str = ""
    session_name: str = ""
    ray_commit: str = ""
    session_dir: str = ""
    node_id: str = ""
    """Hex id of the head node the GCS runs on (names the port file)."""


_TYPES: dict[str, FlagType] = {
    f.name: ("bool" if f.type == "bool" else "int32" if f.type == "int" else "string")
    for f in dataclasses.fields(GcsServerFlags)
}
_HELP_FLAGS = frozenset(
    {"help", "helpfull", "helpshort", "helppackage", "helpxml", "helpmatch", "helpon", "version"}
)
_TRUE = frozenset({"true", "t", "yes", "y", "1"})
_FALSE = frozenset({"false", "f", "no", "n", "0"})


def _bool(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise FlagError(f"ERROR: illegal value '{text}' specified for bool flag '{name}'")


def _int32(name: str, text: str) -> int:
    try:
        value = int(text.strip(), 0) if text.strip().lower().startswith("0x") else int(text)
    except ValueError:
        raise FlagError(
            f"ERROR: illegal value '{text}' specified for int32 flag '{name}'"
        ) from None
    if not INT32_MIN <= value <= INT32_MAX:
        raise FlagError(f"ERROR: illegal value '{text}' specified for int32 flag '{name}'")
    return value


def parse(argv: Sequence[str]) -> tuple[GcsServerFlags, list[str]]:
    """``(flags, positional arguments)``; raises :class:`FlagError` / :class:`HelpRequested`."""
    values: dict[str, object] = {}
    undefok: set[str] = set()
    unknown: list[str] = []
    positional: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional.extend(args[i:])
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        name, has_value, text = body.partition("=")
        name = name.replace("-", "_")
        if name in _HELP_FLAGS:
            raise HelpRequested(name)
        if name == "undefok":
            if not has_value:
                if i >= len(args):
                    raise FlagError("ERROR: flag 'undefok' is missing its argument")
                text, i = args[i], i + 1
            undefok.update(part.strip().replace("-", "_") for part in text.split(",") if part)
            continue
        kind = _TYPES.get(name)
        if (
            kind is None
            and not has_value
            and name.startswith("no")
            and _TYPES.get(name[2:]) == "bool"
        ):
            values[name[2:]] = False
            continue
        if kind is None:
            unknown.append(name)
            continue
        if kind == "bool":
            values[name] = _bool(name, text) if has_value else True
            continue
        if not has_value:
            if i >= len(args):
                raise FlagError(f"ERROR: flag '{name}' is missing its argument")
            text, i = args[i], i + 1
        values[name] = _int32(name, text) if kind == "int32" else text
    refused = [name for name in unknown if name not in undefok]
    if refused:
        raise FlagError(f"ERROR: unknown command line flag '{refused[0]}'")
    return GcsServerFlags(**values), positional  # type: ignore[arg-type]


def usage() -> str:
    lines = ["gcs-server: a drop-in for Ray 2.60's gcs_server (the gcs control plane).", ""]
    defaults = GcsServerFlags()
    for f in dataclasses.fields(GcsServerFlags):
        lines.append(f"  --{f.name} ({_TYPES[f.name]}, default {getattr(defaults, f.name)!r})")
    return "\n".join(lines)
