"""Ray 2.60's own decision about token auth, in the environments the suite gives Ray
processes (issue 18 item 11): the session's HOME holds a decoy ``.ray/auth_token``, so the
decision would be "token" (what made ``ray start --head`` turn auth on and two interop tests
fail on a machine with a token) were RAY_AUTH_MODE not set explicitly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gcs.testing.hermetic import decoy_token
from tests.interop import venvs
from tests.interop.ray_processes import ray_env

pytestmark = pytest.mark.interop

DECIDE = """
import json
from ray._private.authentication.authentication_token_setup import (
    maybe_enable_token_auth_if_token_available as decide,
)
print(json.dumps({"token": decide(warn_if_disabled=False)}))
"""


def decides_token(venv: venvs.Venv, env: dict[str, str]) -> bool:
    """What ``ray start --head`` decides in ``env`` (run in a process of exactly ``env``)."""
    done = subprocess.run(
        [str(venv.python), "-c", DECIDE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=str(venv.path),
    )
    return bool(json.loads(done.stdout.strip().splitlines()[-1])["token"])


def test_ray_decides_no_auth_despite_a_token_in_home(
    ray_venv: venvs.Venv, hermetic_home: Path, tmp_path: Path
) -> None:
    session = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    assert (hermetic_home / ".ray" / "auth_token").is_file()
    # the decoy is real: without an explicit mode Ray turns token auth on from it
    unset = {k: v for k, v in session.items() if k != "RAY_AUTH_MODE"}
    assert decides_token(ray_venv, unset)
    # the session's environment, as every process a test starts inherits it
    assert not decides_token(ray_venv, session)
    # a Ray process's own environment, even with a token in its own HOME
    own = ray_env(tmp_path / "r")
    decoy_token(Path(own["HOME"]))
    assert not decides_token(ray_venv, own)
