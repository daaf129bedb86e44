"""Same-host death detection for ``gcs serve --ha`` members (the lease's TTL is the fallback).

Every member holds an exclusive ``flock`` on a file named for its lease holder id in one
directory per store and namespace (``ha.lock_dir``, by default
``<tmp>/gcs-ha-<hash of store URL + namespace>``, mode 0700) for as long as it runs.  The
kernel drops a ``flock`` the instant its process dies (``kill -9`` included) and never while
it is merely paused (``SIGSTOP``) or slow.  A standby that finds the lease holder's file in
the directory *held* watches it: once it can take the lock itself, the holder is dead, and
the standby releases the dead holder's lease by ``(holder, epoch)`` (an atomic compare in
every store: it frees nothing if anyone renewed or took the lease since) and acquires
normally -- so fencing still makes a wrong guess harmless.  A holder on another host has no
file here: the standby waits for its TTL as before.

A file found *free* proves nothing (a holder dead long ago, or one that reused a configured
holder name on this host earlier): only a lock seen held and then released counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Awaitable
from typing import Protocol

import structlog

from gcs.base.clock import Clock

__all__ = ["HolderInUse", "HolderLocks", "LockDir", "default_lock_dir"]

log = structlog.get_logger("gcs.ha")

POLL_S = 0.01
"""How often a watched lock is tried (a non-blocking ``flock``: one syscall)."""
HOLD_ATTEMPTS = 20
"""Tries to take this member's own lock at start (``POLL_S`` apart) before the name is
deemed in use by a live process."""


class HolderInUse(RuntimeError):
    """Another live process on this host holds the same ``ha.holder`` name."""


class HolderLocks(Protocol):
    """What the coordinator needs (tests pass a fake)."""

    async def hold(self, holder: str) -> None:
        """Lock ``holder``'s file for as long as this process runs (or until :meth:`release`)."""

    def release(self) -> None:
        """A clean stop: unlock and remove this member's file."""

    def watch(self, holder: str) -> Awaitable[None] | None:
        """None when ``holder`` holds no lock here (another host, or a stale file); else an
        awaitable that completes once ``holder``'s process died."""


def default_lock_dir(store_url: str, namespace: str, pid: int | None = None) -> pathlib.Path:
    """One directory per cluster on this host.  A ``memory://`` store lives in one process,
    so two processes on it are two clusters: their directory names the process too (else
    two unrelated servers with the same holder name refuse each other's start)."""
    key = f"{store_url}\0{namespace}"
    if store_url.startswith("memory:"):
        key += f"\0{os.getpid() if pid is None else pid}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return pathlib.Path(tempfile.gettempdir()) / f"gcs-ha-{digest}"


class LockDir:
    """:class:`HolderLocks` on ``flock`` files in one directory (see the module docstring)."""

    def __init__(self, directory: pathlib.Path, clock: Clock) -> None:
        self.directory = directory
        self._clock = clock
        self._held: tuple[pathlib.Path, int] | None = None

    def path(self, holder: str) -> pathlib.Path:
        return self.directory / f"{hashlib.sha256(holder.encode()).hexdigest()[:32]}.lock"

    async def hold(self, holder: str) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(holder)
        for attempt in range(HOLD_ATTEMPTS):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            if not _try_lock(fd):
                os.close(fd)
                if attempt == HOLD_ATTEMPTS - 1:
                    raise HolderInUse(
                        f"ha.holder {holder!r} is already in use by another process on this "
                        f"host (lock {path})"
                    )
                # a standby probing a stale file holds it for an instant
                await self._clock.sleep(POLL_S)
                continue
            if not _names(path, fd):
                os.close(fd)  # a watcher removed the file we opened: lock the new one
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{holder}\n{os.getpid()}\n".encode())
            self._held = (path, fd)
            return
        raise HolderInUse(f"ha.holder {holder!r}: could not lock {path}")

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            path, fd = held
            _unlink_if_same(path, fd)
            os.close(fd)

    def watch(self, holder: str) -> Awaitable[None] | None:
        path = self.path(holder)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return None  # not on this host (or not ours to read): the TTL decides
        if _try_lock(fd):
            os.close(fd)  # free: proves nothing (see the module docstring)
            return None
        return self._wait_released(path, fd)

    async def _wait_released(self, path: pathlib.Path, fd: int) -> None:
        try:
            while not _try_lock(fd):
                await self._clock.sleep(POLL_S)
            _unlink_if_same(path, fd)
        finally:
            os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _names(path: pathlib.Path, fd: int) -> bool:
    """Whether ``path`` still names ``fd``'s file."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


def _unlink_if_same(path: pathlib.Path, fd: int) -> None:
    """Remove ``path`` if it still names ``fd``'s file (the lock is ours)."""
    if _names(path, fd):
        with contextlib.suppress(OSError):
            os.unlink(path)
