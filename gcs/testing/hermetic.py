"""Environments that keep test processes off the user's home and settings.

Ray 2.60's ``ray start --head`` turns token authentication on by itself when
``$HOME/.ray/auth_token`` exists and ``RAY_AUTH_MODE`` is unset (``ray.init()`` of a new
local cluster even writes one there); our clients read that file in token mode; Kubernetes
clients read ``~/.kube/config``; ``RAY_ADDRESS`` / ``GCS_ADDRESS`` redirect CLIs.  A test must
behave the same on every machine, so the processes it starts get :func:`isolated_env`: a
private HOME (and temp dir), ``RAY_AUTH_MODE`` set explicitly, and the user's auth, TLS,
address and Kubernetes settings dropped.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DECOY_TOKEN", "LEAKED_SETTINGS", "decoy_token", "isolated_env", "user_home"]

LEAKED_SETTINGS = (
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_USE_TLS",
    "RAY_TLS_SERVER_CERT",
    "RAY_TLS_SERVER_KEY",
    "RAY_TLS_CA_CERT",
    "RAY_ADDRESS",
    "GCS_ADDRESS",
    "KUBECONFIG",
)
"""The user's settings a test process must never inherit (a test that needs one sets it)."""

DECOY_TOKEN = "decoy-token-of-a-hermetic-test-home"


def isolated_env(
    root: Path,
    base: Mapping[str, str] | None = None,
    *,
    auth_mode: str = "disabled",
    temp_dir: bool = True,
) -> dict[str, str]:
    """``base`` (default ``os.environ``) with HOME = ``root/home`` (and, with ``temp_dir``,
    TMPDIR = ``root/tmp``), both created; ``RAY_AUTH_MODE`` = ``auth_mode``; without
    :data:`LEAKED_SETTINGS`.  Keep ``root`` short when a Ray process's AF_UNIX sockets may
    land under TMPDIR (107 bytes in all)."""
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for name in LEAKED_SETTINGS:
        env.pop(name, None)
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    if temp_dir:
        tmp = root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
    env["RAY_AUTH_MODE"] = auth_mode
    return env


def decoy_token(home: Path) -> Path:
    """Write ``home/.ray/auth_token``, as on a machine where someone ran ``ray
    get-auth-token --generate``: a process that decides authentication from HOME instead of
    an explicit ``RAY_AUTH_MODE`` turns token auth on and fails against the test's GCS."""
    path = home / ".ray" / "auth_token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DECOY_TOKEN + "\n")
    return path


def user_home() -> Path:
    """The account's home from the password database, whatever HOME says: for what is
    meant to live there across runs (the interop venv cache), never for configuration."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)
