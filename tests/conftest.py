"""Shared fixtures: a GCS server on a free port with an in-memory store.

Waiting, as the suite must pass at ``-n 4`` on 2 cores: what the code times with an injected
clock is driven by a ``FakeClock`` (``advance_until``, or ``advance`` and a counter such as
``FakeClock.sleepers``, to show that nothing happens before its time); anything else is
waited for as a condition (``eventually``) with a deadline that only bounds a hang.  Never a
fixed sleep that passes without checking, never a tight deadline on a call that must
succeed."""

from __future__ import annotations

import compileall
import functools
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import structlog
from hypothesis import settings

from gcs.base.clock import FakeClock
from gcs.config import GcsConfig, HealthCheckConfig, LoadPollConfig
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from gcs.testing.hermetic import decoy_token, isolated_env
from gcs.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling

    from tests.forked_cli import ForkedCli

pytest_plugins = ("pytester", "tests.interop.fixtures")
"""pytester (tests of the suite's own hooks), and the cached Ray / ant-ray virtualenvs
(``ray_venv``, ...) for every test directory, with the hook that builds them before any
test runs."""

settings.register_profile("thorough", max_examples=1000)
"""Hypothesis: the suite's tests that leave ``max_examples`` unset run Hypothesis's default
100 examples; ``pytest --hypothesis-profile=thorough`` runs 1,000 (before a release, or on
changing what they check).  Failures found are replayed first from ``.hypothesis/``."""


def pytest_configure(config: pytest.Config) -> None:
    """The checkout's bytecode written once, before any test: every process a test starts
    (``python -m gcs ...``, Ray drivers importing our helpers) would otherwise compile what
    it imports from source, ~1 CPU s a process, as PYTHONDONTWRITEBYTECODE (set on CI
    machines, and on this one) keeps imports from caching it.  Not on xdist's workers: the
    controller did it.

    And pytest's own cache of the test modules with their asserts rewritten (a
    ``*-pytest-*.pyc`` beside each): PYTHONDONTWRITEBYTECODE stops pytest writing it, so
    every process collecting the suite (each xdist worker, each pytester run) rewrote and
    compiled all ~300 test modules again: ~12 CPU s a collection, ~5 with the cache.  Only
    this process writes bytecode from here on; the processes it starts keep the setting."""
    sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).resolve().parents[1]
    for package in ("gcs", "tests", "bench"):
        compileall.compile_dir(root / package, quiet=2)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """``--dist loadgroup`` (scripts/test.sh): one worker per interop module, see
    :mod:`tests.interop.xdist_groups`."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.interop.xdist_groups import InteropModuleScheduling

    return InteropModuleScheduling(config, log)


def fast_config(**overrides: object) -> GcsConfig:
    """Ray's periods scaled down so tests observe deaths and polls in well under a second.

    Timeouts stay generous: a raylet that is gone refuses the connection at once (its death
    takes ``failure_threshold`` periods, not timeouts), while a live in-process raylet slowed
    by a loaded machine must not miss health checks or polls (false deaths, poll backoff)."""
    base = {
        "host": "127.0.0.1",
        "port": 0,
        "storage": "memory://",  # not the default SQLite under the checkout's .gcs-data
        "metrics_port": -1,
        "health": HealthCheckConfig(
            initial_delay_ms=100, period_ms=100, timeout_ms=5_000, failure_threshold=3
        ),
        "load_poll": LoadPollConfig(period_ms=100, timeout_ms=5_000),
    }
    base.update(overrides)
    return GcsConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def hermetic_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test reads the user's home or settings: for the whole session HOME is a private
    directory that holds a decoy ``.ray/auth_token`` (the suite must pass on a machine where
    one exists: Ray 2.60 turns token auth on from it unless RAY_AUTH_MODE is explicit),
    RAY_AUTH_MODE is ``disabled``, and the user's auth, TLS, address and Kubernetes settings
    are gone (:mod:`gcs.testing.hermetic`).  Every process a test starts inherits this; Ray
    processes also get a HOME and temp dir of their own (``tests/interop``).  The session's
    home is yielded; the environment is restored at the end."""
    saved = dict(os.environ)
    env = isolated_env(tmp_path_factory.mktemp("hermetic"), saved, temp_dir=False)
    decoy_token(Path(env["HOME"]))
    os.environ.clear()
    os.environ.update(env)
    try:
        yield Path(env["HOME"])
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def _logs_on_stderr() -> None:
    """Server and agent logs go to stderr, as in production, so a test reading a command's
    stdout (CliRunner's ``result.stdout``) never sees log lines mixed in.  Not cached, so
    ``structlog.testing.capture_logs`` keeps working."""
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__),
        cache_logger_on_first_use=False,
    )


@pytest.fixture(autouse=True)
def _logging_as_the_suite_configured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A command run in this process (``gcs serve``, ``gcs ha``) configures logging as its
    process would: a level filter, and loggers cached on first use, which
    ``structlog.testing.capture_logs`` can no longer reach for the rest of the worker (a
    later test saw no ``ha.handed_over``).  Here nothing is cached, and each test starts
    from the suite's configuration."""
    import gcs.server.logging as gcs_logging

    saved = structlog.get_config()
    configure = gcs_logging.configure_logging
    monkeypatch.setattr(gcs_logging, "configure_logging", functools.partial(configure, cache=False))
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server (appendonly, fsync always) on a free port for the session."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def gcs_cli() -> Iterator[ForkedCli]:
    """``python -m gcs ...`` as real processes forked from one that has imported the CLI
    (:mod:`tests.forked_cli`): for tests of what a command prints and exits with."""
    from tests.forked_cli import ForkedCli

    cli = ForkedCli()
    try:
        yield cli
    finally:
        cli.close()


@pytest.fixture
async def memory_store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def gcs_clock() -> FakeClock:
    """Ask for it and the ``gcs_server`` runs on it: its loops (load polls, health checks,
    placement retries, VC passes) move only when the test moves it."""
    return FakeClock()


@pytest.fixture
async def gcs_server(
    memory_store: MemoryStore, request: pytest.FixtureRequest
) -> AsyncIterator[GcsServer]:
    """On ``gcs_clock`` when the test asks for it, else on the system clock (tests beside
    real Ray processes, whose time is not ours to move)."""
    clock = request.getfixturevalue("gcs_clock") if "gcs_clock" in request.fixturenames else None
    server = GcsServer(fast_config(), store=memory_store, clock=clock)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def poll_rounds(server: GcsServer, clock: FakeClock, rounds: int = 2) -> None:
    """Move ``clock`` until the server made ``rounds`` more load-poll rounds, every reply
    applied (the first may have started before the latest registration; a later round can
    finish while a slow reply of an earlier one is still on its way)."""
    assert server.managers is not None
    poller = server.managers.poller
    target = poller.stats.rounds + rounds
    await clock.advance_until(
        lambda: poller.stats.rounds >= target and poller.settled,
        step_s=server.config.load_poll.period_ms / 1000,
    )


class Stubs:
    """Client stubs for every GCS service, carrying the cluster id like Ray's clients.

    Deadlines are generous (30 s): a call that fails does so at once, and one that must
    succeed must not time out because a loaded machine stalled this process."""

    def __init__(self, channel: object, cluster_id: bytes) -> None:
        from gcs.rpc import ServiceStub
        from gcs.rpc import descriptors as svc

        md = [("ray_cluster_id", cluster_id.hex())]
        self.cluster_id = cluster_id
        deadline_s = 30

        def stub(service: object) -> ServiceStub:
            return ServiceStub(channel, service, metadata=md, timeout_s=deadline_s)

        self.node_info = stub(svc.NODE_INFO)
        self.node_resources = stub(svc.NODE_RESOURCE_INFO)
        self.kv = stub(svc.INTERNAL_KV)
        self.autoscaler = stub(svc.AUTOSCALER_STATE)
        self.jobs = stub(svc.JOB_INFO)
        self.pgs = stub(svc.PLACEMENT_GROUP_INFO)
        self.workers = stub(svc.WORKER_INFO)
        self.tasks = stub(svc.TASK_INFO)
        self.runtime_env = stub(svc.RUNTIME_ENV)
        self.actors = stub(svc.ACTOR_INFO)


@pytest.fixture
async def stubs(gcs_server: GcsServer) -> AsyncIterator[Stubs]:
    import grpc

    async with grpc.aio.insecure_channel(gcs_server.address) as channel:
        assert gcs_server.meta is not None
        yield Stubs(channel, gcs_server.meta.cluster_id)


class Seen(list):  # type: ignore[type-arg]
    """What callbacks received (a subscriber's messages...): tests wait for it to arrive
    (``await seen.until(...)``), not for time."""

    def __init__(self) -> None:
        super().__init__()
        from gcs.base.changes import Changes

        self.changes = Changes()

    def append(self, item: object) -> None:
        super().append(item)
        self.changes.notify()

    async def until(self, predicate: Callable[[], object]) -> None:
        await self.changes.until(predicate)


async def eventually(predicate: object, timeout_s: float = 30.0, interval_s: float = 0.02) -> None:
    """Wait until ``predicate()`` (sync or async) is truthy; fail with a clear message.

    The deadline only bounds a hang: a condition that holds returns at once, so it is generous
    enough for a machine running the suite at ``-n 4`` on 2 cores."""
    import asyncio

    await _poll(predicate, timeout_s, lambda: asyncio.sleep(interval_s))


async def advance_until(
    clock: FakeClock, predicate: object, step_s: float, timeout_s: float = 30.0
) -> None:
    """:meth:`FakeClock.advance_until` (kept for older call sites)."""
    await clock.advance_until(predicate, step_s, timeout_s=timeout_s)  # type: ignore[arg-type]


async def _poll(
    predicate: object, timeout_s: float, between: Callable[[], Awaitable[object]]
) -> None:
    import asyncio
    import inspect

    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = predicate()  # type: ignore[operator]
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await between()
