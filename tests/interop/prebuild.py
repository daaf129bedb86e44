"""What the suite needs installed before its tests run, and the one place that builds it.

Every cached virtualenv a test uses is a :class:`Need`; a fixture that hands one out is named
in :data:`FIXTURE_NEEDS`.  ``python -m tests.interop.venvs`` (scripts/test.sh runs it before
pytest) builds them all; a ``pytest`` run started directly builds the ones its collected
tests ask for once collection ends (:mod:`tests.interop.fixtures`), before any test starts
and so outside pytest's per-test timeout.  Builds of different venvs run at once (each venv
has its own lock; wheels download one at a time): one line per step, with the seconds since
the stage began; pip's output goes to each venv's log (:func:`venvs.log_path`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tests.interop import venvs


@dataclass(frozen=True)
class Need:
    """One thing built before tests: ``ready`` checks without building; ``build`` builds
    (idempotent, locked against other builders)."""

    name: str
    what: str
    """How messages name it (``ray==2.60.0``)."""
    ready: Callable[[], bool]
    build: Callable[[venvs.Progress], object]


def _ray_with_our_dependencies(progress: venvs.Progress) -> None:
    venvs.ensure_our_dependencies(venvs.ensure_venv(venvs.RAY, progress), progress)


def _ray_suite_ready() -> bool:
    from bench import ray_suite

    return not ray_suite.has_tests() or venvs.is_complete(ray_suite.suite_spec("ours"))


def _ray_suite_build(progress: venvs.Progress) -> None:
    from bench import ray_suite

    if ray_suite.has_tests():  # else its tests skip, naming GCS_RAY_TESTS
        ray_suite.prepare("ours", progress=progress)


NEEDS: dict[str, Need] = {
    need.name: need
    for need in (
        Need(
            "ray", "ray==2.60.0",
            lambda: venvs.is_complete(venvs.RAY),
            lambda progress: venvs.ensure_venv(venvs.RAY, progress),
        ),
        Need(
            "ray+gcs", "ray==2.60.0 with our runtime dependencies",
            lambda: venvs.is_complete(venvs.RAY)
            and venvs.has_our_dependencies(venvs.venv_of(venvs.RAY)),
            _ray_with_our_dependencies,
        ),
        Need(
            "ray-default", "ray[default]==2.60.0",
            lambda: venvs.is_complete(venvs.RAY_DEFAULT),
            lambda progress: venvs.ensure_venv(venvs.RAY_DEFAULT, progress),
        ),
        Need(
            "ant-ray", "ant-ray==2.44.1.1",
            lambda: venvs.is_complete(venvs.ANT_RAY),
            lambda progress: venvs.ensure_venv(venvs.ANT_RAY, progress),
        ),
        Need(
            "ray-suite", "ray-suite (ray[default]==2.60.0, Ray's test tools, our gcs_server)",
            _ray_suite_ready,
            _ray_suite_build,
        ),
    )
}  # fmt: skip
"""``ray+gcs`` builds ``ray`` first (one venv, one lock: they run in one thread)."""

FIXTURE_NEEDS: dict[str, tuple[str, ...]] = {
    "ray_venv": ("ray",),
    "ray_wheel": ("ray",),
    "ray_venv_with_gcs": ("ray+gcs",),
    "ray_default_venv": ("ray-default",),
    "ant_ray_venv": ("ant-ray",),
    "ant_ray_wheel": ("ant-ray",),
    "ray_suite_venv": ("ray-suite",),
}
"""Each fixture that hands out something built, and the needs it checks (the wheels come
with their venvs)."""

_CHAINS = (("ray", "ray+gcs"), ("ray-default",), ("ant-ray",), ("ray-suite",))
"""Needs built one after another (same venv); chains run at once.  Measured from an empty
cache on the 2-core machine (quiet, no pip cache): 260 s at once, 285 s one at a time
(``--jobs 1``); pip is mostly CPU here, so the gain is the downloads' overlap."""


def needs_of(fixture_names: Iterable[str]) -> list[str]:
    """The needs of tests asking for ``fixture_names``, in :data:`NEEDS` order."""
    wanted = {need for name in fixture_names for need in FIXTURE_NEEDS.get(name, ())}
    return [name for name in NEEDS if name in wanted]


class Reporter:
    """Prints one line per step: ``[  12.3s] ray-default: installing ...``."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._start = time.monotonic()
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def say(self, name: str, text: str) -> None:
        with self._lock:
            self._write(f"[{self.elapsed():6.1f}s] {name}: {text}")

    def for_need(self, name: str) -> venvs.Progress:
        return lambda text: self.say(name, text)


def build(names: Sequence[str], reporter: Reporter, *, jobs: int = len(_CHAINS)) -> dict[str, str]:
    """Build the needs ``names`` (and what they come after) that are not ready; returns
    each failed need's one-line reason (empty: all ready)."""
    chains = [[n for n in chain if n in names] for chain in _CHAINS]
    chains = [chain for chain in chains if chain]
    failures: dict[str, str] = {}

    def run(chain: list[str]) -> None:
        for name in chain:
            need = NEEDS[name]
            if need.ready():
                continue
            started = reporter.elapsed()
            try:
                need.build(reporter.for_need(name))
            except venvs.VenvError as exc:
                failures[name] = str(exc).splitlines()[0]
                reporter.say(name, f"FAILED: {failures[name]}")
                return
            reporter.say(name, f"ready ({reporter.elapsed() - started:.1f}s)")

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for future in [pool.submit(run, chain) for chain in chains]:
            future.result()
    return failures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.interop.venvs",
        description="Build the cached virtualenvs the test suite uses (under "
        "$GCS_INTEROP_CACHE, default ~/.cache/gcs-interop), before running it.",
    )
    parser.add_argument("needs", nargs="*", help=f"of {', '.join(NEEDS)} (default: all)")
    parser.add_argument("--jobs", type=int, default=len(_CHAINS), help="builds at once")
    args = parser.parse_args(argv)
    unknown = [n for n in args.needs if n not in NEEDS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)} (known: {', '.join(NEEDS)})")
    names = args.needs or list(NEEDS)
    names = [n for n in NEEDS if n in names or (n == "ray" and "ray+gcs" in names)]
    reporter = Reporter(lambda line: print(line, flush=True))
    print(f"interop virtualenvs under {venvs.cache_root()}: {', '.join(names)}", flush=True)
    failures = build(names, reporter, jobs=args.jobs)
    if failures:
        for name, reason in failures.items():
            print(f"error: cannot build {NEEDS[name].what}: {reason}", file=sys.stderr)
        return 1
    print(f"interop virtualenvs ready in {reporter.elapsed():.1f}s", flush=True)
    return 0
