"""Same-host death detection (gcs.server.ha_lock) on real flock files: a holder in another
process, killed -9 (the kernel drops its lock) or paused (it does not)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pathlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gcs.base.clock import SystemClock
from gcs.config import load_config
from gcs.server.ha_lock import HolderInUse, LockDir, default_lock_dir, process_start
from gcs.server.ha_member import holder_locks
from gcs.store.memory import MemoryStore

HOLD = """
import asyncio, sys, time
from gcs.base.clock import SystemClock
from gcs.server.ha_lock import LockDir
import pathlib
locks = LockDir(pathlib.Path(sys.argv[1]), SystemClock())
asyncio.run(locks.hold(sys.argv[2]))
if len(sys.argv) > 3:  # a role and epoch for its record
    locks.mark(sys.argv[3], int(sys.argv[4]))
print("held", flush=True)
time.sleep(120)  # held until the test ends (kills) it
"""


def holding(locks: pathlib.Path, *mark: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding ``leader``'s lock (its record marked ``mark``: role, epoch)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(locks), "leader", *mark],
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"held\n"
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(10)


@pytest.fixture
def holder(tmp_path: pathlib.Path) -> Iterator[subprocess.Popen[bytes]]:
    yield from holding(tmp_path / "locks")


async def test_a_holder_killed_9_is_seen_dead_at_once_and_its_file_removed(
    tmp_path: pathlib.Path, holder: subprocess.Popen[bytes]
) -> None:
    locks = LockDir(tmp_path / "locks", SystemClock())
    assert oct((tmp_path / "locks").stat().st_mode & 0o777) == oct(0o700)
    died = locks.watch("leader")
    assert died is not None
    watch = asyncio.ensure_future(died)
    await asyncio.sleep(0.1)
    assert not watch.done(), "the holder lives"
    holder.kill()
    holder.wait(10)
    await asyncio.wait_for(watch, timeout=5)  # a real process: bounded, ~10 ms in practice
    assert not locks.path("leader").exists()


async def test_a_paused_holder_is_not_seen_dead(
    tmp_path: pathlib.Path, holder: subprocess.Popen[bytes]
) -> None:
    locks = LockDir(tmp_path / "locks", SystemClock())
    died = locks.watch("leader")
    assert died is not None
    watch = asyncio.ensure_future(died)
    os.kill(holder.pid, signal.SIGSTOP)
    await asyncio.sleep(0.5)
    assert not watch.done()
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)


async def test_no_file_or_a_free_file_gives_nothing_to_watch(tmp_path: pathlib.Path) -> None:
    """Another host's holder has no file here; a file nobody holds proves nothing."""
    locks = LockDir(tmp_path / "locks", SystemClock())
    assert locks.watch("elsewhere") is None
    stale = LockDir(tmp_path / "locks", SystemClock())
    await stale.hold("stale")
    os.close(stale._held[1])  # type: ignore[index]  # its process "died" long ago
    assert locks.path("stale").exists()
    assert locks.watch("stale") is None


async def test_a_holder_name_is_held_once_per_host_and_released_on_a_clean_stop(
    tmp_path: pathlib.Path,
) -> None:
    first = LockDir(tmp_path / "locks", SystemClock())
    await first.hold("x")
    with pytest.raises(HolderInUse, match="already in use"):
        await LockDir(tmp_path / "locks", SystemClock()).hold("x")
    first.release()
    assert not first.path("x").exists()


async def test_a_member_starting_while_a_standby_probes_its_stale_file_still_takes_its_lock(
    tmp_path: pathlib.Path,
) -> None:
    """A standby checking a stale file holds its lock for an instant (or, having seen the
    holder die, removes the file): a member starting under that name meanwhile waits a
    moment, and locks the file that stays in the directory."""
    locks = LockDir(tmp_path / "locks", SystemClock())
    path = locks.path("x")
    path.parent.mkdir(mode=0o700)
    probe = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(probe, fcntl.LOCK_EX)

    def done_probing() -> None:
        os.unlink(path)  # as a watcher does once the old holder died
        os.close(probe)

    timer = threading.Timer(0.03, done_probing)
    timer.start()
    try:
        await locks.hold("x")
    finally:
        timer.join()
    check = os.open(path, os.O_RDWR)  # the file in the directory is the one held
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(check, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(check)
    locks.release()


def test_the_default_directory_is_per_store_identity_and_namespace() -> None:
    one = default_lock_dir("c0ffee", "a")
    assert one == default_lock_dir("c0ffee", "a")
    assert one != default_lock_dir("c0ffee", "b")
    assert one != default_lock_dir("decade", "a")


async def test_members_reaching_one_store_by_different_urls_share_the_lock_directory() -> None:
    """Issue 29 item 6: one store reached by hostname and by IP (or through a proxy) is
    one cluster: its members must see each other's death, so their directory follows the
    store's identity (its cluster id), not the URL text."""
    shared = MemoryStore()
    dirs = []
    for url in ("redis://localhost:7001/0", "redis://127.0.0.1:7001/0", "redis://proxy:9/0"):
        config = load_config(flags={"storage": url, "ha.enabled": True})
        locks = await holder_locks(config, SystemClock(), shared.handle())
        assert locks is not None
        dirs.append(locks.directory)
    assert dirs[0] == dirs[1] == dirs[2]
    other = await holder_locks(
        load_config(flags={"storage": "redis://localhost:7001/0", "ha.enabled": True}),
        SystemClock(),
        MemoryStore(),  # another store (its own cluster id) at the same URL text
    )
    assert other is not None and other.directory != dirs[0]


@pytest.fixture
def leader(tmp_path: pathlib.Path) -> Iterator[subprocess.Popen[bytes]]:
    yield from holding(tmp_path / "locks", "leader", "7")


def test_a_paused_leader_is_ended_by_its_pid_and_start_time(
    tmp_path: pathlib.Path, leader: subprocess.Popen[bytes]
) -> None:
    """Issue 29 item 5: the member that took the lease ends a stalled same-host ex-leader
    (its record: pid, process start time, role leader at the superseded epoch)."""
    locks = LockDir(tmp_path / "locks", SystemClock())
    record = locks.path("leader").read_text().split("\n")
    assert record[:2] == ["leader", str(leader.pid)]
    assert record[2] == process_start(leader.pid) and record[3:5] == ["leader", "7"]
    os.kill(leader.pid, signal.SIGSTOP)
    assert locks.end("leader", 6) is None, "a record of another epoch is not ended"
    assert locks.end("nobody", 7) is None
    assert leader.poll() is None
    assert locks.end("leader", 7) == leader.pid
    assert leader.wait(10) == -signal.SIGKILL


def test_a_reused_pid_or_a_standby_is_never_ended(
    tmp_path: pathlib.Path, leader: subprocess.Popen[bytes]
) -> None:
    locks = LockDir(tmp_path / "locks", SystemClock())
    path = locks.path("leader")
    good = path.read_text()
    fields = good.split("\n")
    fields[2] = str(int(fields[2]) + 1)  # the pid now names a process started later
    path.write_text("\n".join(fields))
    assert locks.end("leader", 7) is None
    fields = good.split("\n")
    fields[3] = "standby"  # it stepped down (its record says so)
    path.write_text("\n".join(fields))
    assert locks.end("leader", 7) is None
    assert leader.poll() is None
