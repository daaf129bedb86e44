"""Cached virtualenvs holding the real Ray 2.60 / ant-ray 2.44 wheels, for interop tests.

Both wheels install the ``ray`` package, so each gets its own virtualenv.  Layout under
``${GCS_INTEROP_CACHE:-~/.cache/gcs-interop}`` (``~`` is the account's home from the password
database: tests run with a private HOME, and this cache is meant to outlive them)::

    wheels/                     raw wheels (``pip download`` first; other tests read them)
    ray-2.60.0/                 the venv; ``.complete`` (JSON stamp) is written last
    ray-2.60.0.lock             ``fcntl.flock`` guard: one builder at a time, across processes
    ant-ray-2.44.1.1/ ...

A venv without a matching stamp is half-built (or built by an older harness) and is rebuilt
from scratch.  Our own package is never installed into the shared venv (several worktrees
use one cache); its runtime dependencies are, once (stamped by their hash), and scripts that
need ``gcs`` run with ``PYTHONPATH`` pointing at the repository under test.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gcs.testing.hermetic import user_home

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
HARNESS_VERSION = 1
"""Bump to force every cached venv to be rebuilt (changes the stamp)."""

_COMPLETE = ".complete"
_OURS_STAMP = ".gcs-deps"
_INSTALL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class VenvSpec:
    """One pinned distribution and what must import for its venv to count as usable."""

    name: str
    """Directory name under the cache root."""
    dist: str
    """Distribution name on PyPI (``ray`` / ``ant-ray``)."""
    version: str
    wheel_glob: str
    """Glob matching the wheel's file name (normalised: ``ant_ray-...``)."""
    local_wheel_dir: pathlib.Path
    """Optional pre-downloaded wheels, used with ``--no-index`` only when present."""
    extra: tuple[str, ...] = ("grpcio",)
    """Packages the checks need that the wheel's base requirements may not bring."""
    wheel_extras: tuple[str, ...] = ()
    """The wheel's own extras to install (``ant-ray[default]`` brings the CLI's aiohttp)."""
    checks: tuple[str, ...] = (
        "import ray",
        "from ray._raylet import GcsClient",
        "import ray.autoscaler.v2.sdk",
        "import ray.core.generated.autoscaler_pb2",
    )

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


RAY = VenvSpec(
    name="ray-2.60.0",
    dist="ray",
    version="2.60.0",
    wheel_glob="ray-2.60.0-*.whl",
    local_wheel_dir=pathlib.Path("/tmp/wheels/ray260"),
)
ANT_RAY = VenvSpec(
    name="ant-ray-2.44.1.1",
    dist="ant-ray",
    version="2.44.1.1",
    wheel_glob="ant_ray-2.44.1.1-*.whl",
    local_wheel_dir=pathlib.Path("/tmp/wheels/antray"),
    wheel_extras=("default",),
    checks=(
        "import ray",
        "from ray._raylet import GcsClient",
        "import ray.autoscaler.v2.sdk",
        "import ray.core.generated.autoscaler_pb2",
        "import ray.scripts.scripts",  # `ray vcluster` needs the dashboard's aiohttp
        "import aiohttp_cors",
    ),
)
RAY_DEFAULT = VenvSpec(
    name="ray-2.60.0-default",
    dist="ray",
    version="2.60.0",
    wheel_glob="ray-2.60.0-*.whl",
    local_wheel_dir=pathlib.Path("/tmp/wheels/ray260"),
    wheel_extras=("default",),
    checks=(
        *RAY.checks,
        "import ray.dashboard.dashboard",  # the dashboard head: aiohttp, opencensus, ...
        "import ray.dashboard.modules.job.job_head",
        "import aiohttp_cors",
    ),
)
"""``ray[default]``: the dashboard, ``ray list`` and ``ray job`` (a venv of its own, so the
plain ``ray`` venv other tests share is not rebuilt)."""
SPECS: Mapping[str, VenvSpec] = {"ray": RAY, "ray-default": RAY_DEFAULT, "ant-ray": ANT_RAY}


class VenvError(RuntimeError):
    """A venv could not be built, or a script run in it failed (message carries stderr)."""


@dataclass(frozen=True)
class Venv:
    spec: VenvSpec
    path: pathlib.Path

    @property
    def python(self) -> pathlib.Path:
        return self.path / "bin" / "python"


def cache_root() -> pathlib.Path:
    raw = os.environ.get("GCS_INTEROP_CACHE")
    if raw:
        return pathlib.Path(raw)
    return user_home() / ".cache" / "gcs-interop"


def _builder_env() -> dict[str, str]:
    """Building the cache (pip) runs as the account, with its own pip settings; the venv's
    contents do not depend on the tests' private HOME."""
    return {**os.environ, "HOME": str(user_home())}


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{name}.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], *, timeout: float = _INSTALL_TIMEOUT_S) -> None:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=_builder_env()
        )
    except subprocess.TimeoutExpired as exc:
        raise VenvError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        raise VenvError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )


def _find_wheel(spec: VenvSpec) -> pathlib.Path | None:
    found = sorted((cache_root() / "wheels").glob(spec.wheel_glob))
    return found[0] if found else None


def wheel_path(dist: str) -> pathlib.Path:
    """The cached wheel file of ``"ray"`` or ``"ant-ray"``, downloading it on first use."""
    spec = SPECS[dist]
    with locked("wheels"):
        return _download_wheel(spec)


def _download_wheel(spec: VenvSpec) -> pathlib.Path:
    """Caller holds the wheels lock.  Local wheels are an accelerator, PyPI the source."""
    existing = _find_wheel(spec)
    if existing is not None:
        return existing
    dest = cache_root() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest)]
    if any(spec.local_wheel_dir.glob(spec.wheel_glob)):
        with contextlib.suppress(VenvError):  # fall through to the index
            _run([*base, "--no-index", "--find-links", str(spec.local_wheel_dir), spec.requirement])
    if _find_wheel(spec) is None:
        _run([*base, spec.requirement])
    found = _find_wheel(spec)
    if found is None:
        raise VenvError(f"pip download {spec.requirement} left no {spec.wheel_glob} in {dest}")
    return found


def _stamp(spec: VenvSpec) -> str:
    return json.dumps(
        {
            "harness": HARNESS_VERSION,
            "requirement": spec.requirement,
            "extra": list(spec.extra),
            "wheel_extras": list(spec.wheel_extras),
            "python": sys.version.split()[0],
        },
        sort_keys=True,
    )


def ensure_venv(spec: VenvSpec) -> Venv:
    """The venv for ``spec``, built once per cache (safe against concurrent builders)."""
    venv = Venv(spec, cache_root() / spec.name)
    stamp = venv.path / _COMPLETE
    with locked(spec.name):
        if stamp.is_file() and stamp.read_text() == _stamp(spec) and venv.python.exists():
            return venv
        with locked("wheels"):
            wheel = _download_wheel(spec)
        shutil.rmtree(venv.path, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv.path)], timeout=300)
        pip = [str(venv.python), "-m", "pip", "install", "--no-input"]
        target = f"{wheel}[{','.join(spec.wheel_extras)}]" if spec.wheel_extras else str(wheel)
        _run([*pip, target, *spec.extra])
        _run([str(venv.python), "-c", "; ".join(spec.checks)], timeout=300)
        stamp.write_text(_stamp(spec))  # last: its presence means "complete"
    return venv


def our_runtime_dependencies() -> list[str]:
    """``[project].dependencies`` of the repository under test."""
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def ensure_our_dependencies(venv: Venv) -> None:
    """Install our runtime dependencies into ``venv`` unless this exact set already is.

    The ``gcs`` package itself is imported from ``REPO_ROOT`` via ``PYTHONPATH`` (see
    :func:`with_our_package`), so the cached venv never points at one particular checkout.
    """
    deps = our_runtime_dependencies()
    digest = hashlib.sha256("\n".join(sorted(deps)).encode()).hexdigest()
    marker = venv.path / _OURS_STAMP
    with locked(venv.spec.name):
        if marker.is_file() and marker.read_text() == digest:
            return
        _run([str(venv.python), "-m", "pip", "install", "--no-input", *deps])
        marker.write_text(digest)


def with_our_package(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment additions that make ``import gcs`` resolve to the repository under test."""
    merged = dict(env or {})
    previous = merged.get("PYTHONPATH")
    merged["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + previous if previous else "")
    return merged


def run_in_venv(
    venv: Venv,
    script: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> dict:
    """Run ``script`` with the venv's interpreter; return the JSON object it printed last.

    The script prints one JSON line (earlier stdout lines, e.g. library chatter, are ignored).
    Raises :class:`VenvError` carrying stderr when it exits non-zero or prints no JSON.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    full_env.setdefault("RAY_AUTH_MODE", "disabled")  # never decided from a token in HOME
    full_env.update(env or {})
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [str(venv.python), "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=str(venv.path),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise VenvError(f"script timed out after {timeout:.0f}s in {venv.spec.name}") from exc
    if proc.returncode != 0:
        raise VenvError(
            f"script failed ({proc.returncode}) in {venv.spec.name} "
            f"after {time.monotonic() - started:.1f}s\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise VenvError(f"script printed nothing in {venv.spec.name}; stderr:\n{proc.stderr}")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise VenvError(
            f"last stdout line is not JSON: {lines[-1][:200]!r}\nstderr:\n{proc.stderr}"
        ) from exc
    if not isinstance(result, dict):
        raise VenvError(f"script printed {type(result).__name__}, expected a JSON object")
    return result


def main(argv: list[str]) -> int:
    """``python -m tests.interop.venvs [ray|ant-ray ...]``: build the venvs ahead of tests."""
    for dist in argv or list(SPECS):
        start = time.monotonic()
        venv = ensure_venv(SPECS[dist])
        print(f"{dist}: {venv.path} ready in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
