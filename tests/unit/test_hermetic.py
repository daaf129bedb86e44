"""The suite never reads the user's home or settings (issue 18 item 11): the session runs
with a private HOME holding a decoy Ray token and an explicit RAY_AUTH_MODE, and Ray's
processes get a HOME and temp dir of their own (:mod:`gcs.testing.hermetic`)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from gcs.testing.hermetic import (
    DECOY_TOKEN,
    LEAKED_SETTINGS,
    decoy_token,
    isolated_env,
    user_home,
)
from tests.interop import venvs
from tests.interop.ray_processes import env_prefix, our_env, ray_env


def test_the_session_runs_in_a_private_home_with_a_token_in_it(hermetic_home: Path) -> None:
    """What every process a test starts inherits: not the account's home, a Ray token
    there (as on a machine where one was generated), auth mode explicit, no leaks."""
    assert os.environ["HOME"] == str(hermetic_home)
    assert hermetic_home != user_home() and user_home() not in hermetic_home.parents
    token = hermetic_home / ".ray" / "auth_token"
    assert token.read_text().strip() == DECOY_TOKEN
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    assert not set(LEAKED_SETTINGS) & set(os.environ)


def test_isolated_env_drops_the_users_settings(tmp_path: Path) -> None:
    base = {name: "users" for name in LEAKED_SETTINGS} | {"PATH": "/bin", "HOME": "/home/u"}
    env = isolated_env(tmp_path / "p", base, auth_mode="token")
    assert env["HOME"] == str(tmp_path / "p" / "home") and Path(env["HOME"]).is_dir()
    assert env["TMPDIR"] == str(tmp_path / "p" / "tmp") and Path(env["TMPDIR"]).is_dir()
    assert env["RAY_AUTH_MODE"] == "token" and env["PATH"] == "/bin"
    assert not set(LEAKED_SETTINGS) & set(env)
    assert "TMPDIR" not in isolated_env(tmp_path / "q", base, temp_dir=False)
    assert decoy_token(Path(env["HOME"])).read_text() == DECOY_TOKEN + "\n"


def test_ray_processes_get_their_own_home_and_temp_dir(tmp_path: Path) -> None:
    env = ray_env(tmp_path / "c")
    assert Path(env["HOME"]).parent == Path(env["TMPDIR"]).parent == tmp_path / "c"
    assert env["RAY_AUTH_MODE"] == "disabled" and "PYTHONPATH" not in env
    ours = our_env(env)
    assert {k: ours[k] for k in ("HOME", "TMPDIR", "RAY_AUTH_MODE")} == {
        k: env[k] for k in ("HOME", "TMPDIR", "RAY_AUTH_MODE")
    }
    words = shlex.split(env_prefix(env) + " ray start")
    assert words[0] == "env" and words[-2:] == ["ray", "start"]
    assert f"HOME={env['HOME']}" in words and "RAY_AUTH_MODE=disabled" in words
    assert ray_env(None)["HOME"] == os.environ["HOME"]  # benches: the caller's


def test_the_venv_cache_stays_in_the_accounts_home(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The one thing kept under the real home: a cache, never read as configuration."""
    monkeypatch.delenv("GCS_INTEROP_CACHE", raising=False)
    assert venvs.cache_root() == user_home() / ".cache" / "gcs-interop"
