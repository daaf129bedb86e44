"""Ray 2.60's token authentication: where the token comes from and how it travels.

Facts (Ray >= 2.52, checked against the 2.60 wheel):

* ``RAY_AUTH_MODE`` is ``disabled`` (default) or ``token`` (Ray lower-cases it).
* The token, highest precedence first: ``RAY_AUTH_TOKEN`` (the value, if non-empty);
  ``RAY_AUTH_TOKEN_PATH`` (a file: unreadable or empty is fatal, no fallback); the default
  file ``$HOME/.ray/auth_token`` (the account's home when ``HOME`` is unset;
  ``_get_default_token_path`` in
  ``ray/_private/authentication/authentication_token_setup.py``).  Files are read up to the
  first newline and stripped of whitespace, like Ray's loader.
* On gRPC the token travels as metadata ``authorization: Bearer <token>``.

The server-side precedence adds our own sources around Ray's (flag > env > file > default):
an explicit path (``gcs serve --auth-token-path`` or the config file's ``auth_token_path``,
see :func:`gcs.config.load_config`) names the file to read.
"""

from __future__ import annotations

import hmac
import os
import pathlib
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field

AUTH_MODES = ("disabled", "token")
AUTHORIZATION_METADATA = "authorization"
BEARER_PREFIX = "Bearer "
UNAUTHENTICATED_MESSAGE = (
    # Ray 2.60's gcs_server answers "InvalidAuthToken: Authentication token is missing or
    # incorrect"; we keep its words (tools match them) and add what to do.
    "InvalidAuthToken: Authentication token is missing or incorrect (this GCS runs with "
    "RAY_AUTH_MODE=token: set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN "
    "or RAY_AUTH_TOKEN_PATH)"
)


class AuthConfigError(ValueError):
    """Authentication or TLS is misconfigured; the message is one line naming the setting."""


@dataclass(frozen=True, slots=True)
class AuthToken:
    """The cluster's token; its value never appears in ``repr`` (nor in logs)."""

    value: str = field(repr=False)
    source: str
    """Where it came from, safe to log: ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH=/p``, ..."""
    _expected: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_expected", self.header_value.encode())

    @property
    def header_value(self) -> str:
        return BEARER_PREFIX + self.value

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((AUTHORIZATION_METADATA, self.header_value),)

    def matches(self, header_value: str | bytes) -> bool:
        """Constant-time check of an ``authorization`` metadata value (runs on every RPC)."""
        presented = header_value.encode() if isinstance(header_value, str) else header_value
        return hmac.compare_digest(presented, self._expected)


def parse_mode(value: str, where: str = "RAY_AUTH_MODE") -> str:
    """``disabled`` or ``token`` (case-insensitive, as Ray reads it); anything else is an error
    here, where Ray would silently disable auth on a typo."""
    mode = (value or "disabled").strip().lower()
    if mode not in AUTH_MODES:
        raise AuthConfigError(f"{where}: must be 'disabled' or 'token', got {value!r}")
    return mode


def default_token_path(env: Mapping[str, str] | None = None) -> pathlib.Path:
    """``$HOME/.ray/auth_token``; with ``HOME`` unset or empty, the account's home from the
    password database, as Ray's loaders find it (Python's ``Path.home()``, the C++
    ``getpwuid_r``): Ray's own tests start drivers with a bare environment
    (``run_string_as_driver(env={...})``), and Ray's GCS then reads the token there."""
    env = os.environ if env is None else env
    home = env.get("HOME") or _account_home()
    return pathlib.Path(home) / ".ray" / "auth_token"


def _account_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir or "."
    except KeyError:  # no entry for this uid (a container's arbitrary user)
        return "."


def read_token_file(path: str | os.PathLike[str], what: str) -> str:
    """First line of ``path``, stripped; unreadable or empty raises with ``what`` named."""
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.readline().strip()
    except OSError as err:
        raise AuthConfigError(f"{what}: cannot read token file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise AuthConfigError(f"{what}: token file {path} is not UTF-8 text") from None
    if not token:
        raise AuthConfigError(f"{what}: token file {path} is empty")
    return token


def load_token(
    env: Mapping[str, str] | None = None, *, explicit_path: str = "", explicit_what: str = ""
) -> AuthToken:
    """The token by Ray's precedence, after an explicit path (flag / config file) if given."""
    env = os.environ if env is None else env
    if explicit_path:
        what = explicit_what or "auth_token_path"
        return AuthToken(read_token_file(explicit_path, what), f"{what}={explicit_path}")
    value = env.get("RAY_AUTH_TOKEN", "").strip()
    if value:
        return AuthToken(value, "RAY_AUTH_TOKEN")
    path = env.get("RAY_AUTH_TOKEN_PATH", "")
    if path:
        return AuthToken(
            read_token_file(path, "RAY_AUTH_TOKEN_PATH"), f"RAY_AUTH_TOKEN_PATH={path}"
        )
    default = default_token_path(env)
    if not default.exists():
        raise AuthConfigError(
            "RAY_AUTH_MODE=token but no token: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, "
            f"or create {default}"
        )
    return AuthToken(read_token_file(default, "default token file"), f"default file {default}")


def client_token(env: Mapping[str, str] | None = None) -> AuthToken | None:
    """What a client sends: ``None`` unless ``RAY_AUTH_MODE=token`` (then the token or an
    :class:`AuthConfigError`, as Ray's clients refuse to start without one)."""
    env = os.environ if env is None else env
    if parse_mode(env.get("RAY_AUTH_MODE", "")) != "token":
        return None
    return load_token(env)
