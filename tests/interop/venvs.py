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

Builds happen before tests run, never inside one (a pip install outlived pytest's 300 s
per-test timeout on a busy machine): ``python -m tests.interop.venvs`` (:data:`BUILD_COMMAND`,
run by scripts/test.sh) builds what the suite needs (:mod:`tests.interop.prebuild`), and the
fixtures (:mod:`tests.interop.fixtures`) only check.  Each build's pip output goes to
``logs/<name>.log`` under the cache.
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from gcs.testing.hermetic import user_home

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
HARNESS_VERSION = 1
"""Bump to force every cached venv to be rebuilt (changes the stamp)."""

_COMPLETE = ".complete"
_OURS_STAMP = ".gcs-deps"
_INSTALL_TIMEOUT_S = 1800.0
BUILD_COMMAND = "python -m tests.interop.venvs"
"""What builds the cached venvs (every one the suite uses); fixtures name it when one is
missing."""

Progress = Callable[[str], None]
"""Told each step of a build as it starts (one short line, e.g. ``installing ...``)."""


def _quiet(step: str) -> None:
    """The default :data:`Progress`: says nothing."""


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


class VenvMissing(VenvError):
    """A venv a test needs is not built (tests never build one: :data:`BUILD_COMMAND`)."""


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


def _run(
    cmd: list[str], *, timeout: float = _INSTALL_TIMEOUT_S, log: pathlib.Path | None = None
) -> None:
    """Run a build command.  With ``log``, its output is appended there (a developer can
    follow it) and a failure's message is one line: the command's last output line and the
    log's path."""
    if log is None:
        _run_captured(cmd, timeout)
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            proc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False,
                env=_builder_env(),
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise VenvError(f"timed out after {timeout:.0f}s: {_short(cmd)} (log: {log})") from exc
    if proc.returncode != 0:
        raise VenvError(
            f"{_short(cmd)} failed (exit {proc.returncode}): {_last_line(log)} (log: {log})"
        )


def _run_captured(cmd: list[str], timeout: float) -> None:
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


def _short(cmd: list[str]) -> str:
    """``pip install`` / ``python -m venv`` / ``python -c``: what failed, without paths."""
    words = [pathlib.Path(cmd[0]).name, *cmd[1:]]
    if words[1:2] == ["-m"]:
        return " ".join(words[2:4]) if words[2:3] == ["pip"] else f"python -m {words[2]}"
    return " ".join(words[:2])


def _last_line(log: pathlib.Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "no output")[:300]


def log_path(name: str) -> pathlib.Path:
    """Where the build of the venv ``name`` writes pip's output (rewritten by each build)."""
    return cache_root() / "logs" / f"{name}.log"


def _find_wheel(spec: VenvSpec) -> pathlib.Path | None:
    found = sorted((cache_root() / "wheels").glob(spec.wheel_glob))
    return found[0] if found else None


def wheel_path(dist: str) -> pathlib.Path:
    """The cached wheel file of ``"ray"`` or ``"ant-ray"``, downloading it on first use."""
    spec = SPECS[dist]
    with locked("wheels"):
        return _download_wheel(spec)


def cached_wheel(dist: str) -> pathlib.Path | None:
    """The cached wheel of ``"ray"`` or ``"ant-ray"`` if it is there (never downloads)."""
    return _find_wheel(SPECS[dist])


def _download_wheel(
    spec: VenvSpec, log: pathlib.Path | None = None, progress: Progress = _quiet
) -> pathlib.Path:
    """Caller holds the wheels lock.  Local wheels are an accelerator, PyPI the source."""
    existing = _find_wheel(spec)
    if existing is not None:
        return existing
    progress(f"downloading the {spec.requirement} wheel")
    dest = cache_root() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest)]
    if any(spec.local_wheel_dir.glob(spec.wheel_glob)):
        with contextlib.suppress(VenvError):  # fall through to the index
            _run(
                [*base, "--no-index", "--find-links", str(spec.local_wheel_dir), spec.requirement],
                log=log,
            )
    if _find_wheel(spec) is None:
        _run([*base, spec.requirement], log=log)
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


def venv_of(spec: VenvSpec) -> Venv:
    """Where the venv of ``spec`` is (built or not)."""
    return Venv(spec, cache_root() / spec.name)


def is_complete(spec: VenvSpec) -> bool:
    """Whether the venv of ``spec`` is built, by this harness, for this Python (never
    builds; the stamp is written last, so a half-built venv is not complete)."""
    venv = venv_of(spec)
    stamp = venv.path / _COMPLETE
    try:
        return stamp.read_text() == _stamp(spec) and venv.python.exists()
    except OSError:
        return False


def ensure_venv(spec: VenvSpec, progress: Progress = _quiet) -> Venv:
    """The venv for ``spec``, built once per cache (safe against concurrent builders)."""
    venv = venv_of(spec)
    with locked(spec.name):
        if is_complete(spec):
            return venv
        log = log_path(spec.name)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        with locked("wheels"):
            wheel = _download_wheel(spec, log, progress)
        shutil.rmtree(venv.path, ignore_errors=True)
        progress("creating the virtualenv")
        _run([sys.executable, "-m", "venv", str(venv.path)], timeout=300, log=log)
        pip = [str(venv.python), "-m", "pip", "install", "--no-input"]
        target = f"{wheel}[{','.join(spec.wheel_extras)}]" if spec.wheel_extras else str(wheel)
        progress(f"installing {pathlib.Path(target).name} {' '.join(spec.extra)}".rstrip())
        _run([*pip, target, *spec.extra], log=log)
        progress("checking its imports")
        _run([str(venv.python), "-c", "; ".join(spec.checks)], timeout=300, log=log)
        (venv.path / _COMPLETE).write_text(_stamp(spec))  # last: its presence means "complete"
    return venv


def require_venv(spec: VenvSpec) -> Venv:
    """The venv of ``spec`` if it is complete, else :class:`VenvMissing` naming the command
    that builds it (never builds)."""
    if not is_complete(spec):
        raise VenvMissing(
            f"the {spec.name} virtualenv is not built under {cache_root()}: "
            f"build it with `{BUILD_COMMAND}`"
        )
    return venv_of(spec)


def our_runtime_dependencies() -> list[str]:
    """``[project].dependencies`` of the repository under test."""
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def _dependencies_digest() -> str:
    return hashlib.sha256("\n".join(sorted(our_runtime_dependencies())).encode()).hexdigest()


def has_our_dependencies(venv: Venv) -> bool:
    """Whether our current runtime dependencies are installed in ``venv`` (never installs)."""
    try:
        return (venv.path / _OURS_STAMP).read_text() == _dependencies_digest()
    except OSError:
        return False


def ensure_our_dependencies(venv: Venv, progress: Progress = _quiet) -> None:
    """Install our runtime dependencies into ``venv`` unless this exact set already is.

    The ``gcs`` package itself is imported from ``REPO_ROOT`` via ``PYTHONPATH`` (see
    :func:`with_our_package`), so the cached venv never points at one particular checkout.
    """
    with locked(venv.spec.name):
        if has_our_dependencies(venv):
            return
        progress("installing our runtime dependencies")
        log = log_path(venv.spec.name)
        _run(
            [str(venv.python), "-m", "pip", "install", "--no-input", *our_runtime_dependencies()],
            log=log,
        )
        (venv.path / _OURS_STAMP).write_text(_dependencies_digest())


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
    """``python -m tests.interop.venvs``: build every venv the suite uses, before tests."""
    from tests.interop import prebuild  # it names what the suite needs (and imports us)

    return prebuild.main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
