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

The file also records its holder's pid, the process's start time (``/proc/<pid>/stat``
field 22: a reused pid has another) and its role and epoch, rewritten as they change.  A
member that took the lease from a holder whose record still says it leads that very epoch
ends it (``SIGKILL``: a paused process cannot run a handler) -- a stalled ex-leader whose
connections hold its clients; the kernel then closes them and they reconnect (issue 29
item 5).  The pid is signalled only while the file is still locked (the holder lives) and
the start time matches.

The default directory is keyed by the store's own identity (its cluster id, created in the
store if absent), not by the URL text: members reaching one store through a proxy, or by
hostname and by IP, share it (item 6).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pathlib
import signal
import tempfile
from collections.abc import Awaitable
from typing import Protocol

import structlog

from gcs.base.clock import Clock

__all__ = ["HolderInUse", "HolderLocks", "LockDir", "default_lock_dir", "process_start"]

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

    def mark(self, role: str, epoch: int) -> None:
        """Record this member's role and lease epoch (read by :meth:`end`)."""

    def end(self, holder: str, epoch: int) -> int | None:
        """End ``holder``'s process if it lives on this host and its record says it leads
        at ``epoch``: its pid, else None."""


def default_lock_dir(store_id: str, namespace: str) -> pathlib.Path:
    """One directory per cluster on this host, named for the store's own identity (its
    cluster id: a ``memory://`` store in another process is another store, with its own)."""
    digest = hashlib.sha256(f"{store_id}\0{namespace}".encode()).hexdigest()[:16]
    return pathlib.Path(tempfile.gettempdir()) / f"gcs-ha-{digest}"


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    None if there is no such process (or no ``/proc``)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


class LockDir:
    """:class:`HolderLocks` on ``flock`` files in one directory (see the module docstring)."""

    def __init__(self, directory: pathlib.Path, clock: Clock) -> None:
        self.directory = directory
        self._clock = clock
        self._held: tuple[pathlib.Path, int] | None = None
        self._record = ""

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
            pid = os.getpid()
            self._record = f"{holder}\n{pid}\n{process_start(pid) or ''}\n"
            self._held = (path, fd)
            self.mark("standby", 0)
            return
        raise HolderInUse(f"ha.holder {holder!r}: could not lock {path}")

    def mark(self, role: str, epoch: int) -> None:
        if self._held is None:
            return
        data = f"{self._record}{role}\n{epoch}\n".encode()
        fd = self._held[1]
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        except OSError as err:
            log.warning("ha.lock_record_failed", error=str(err))

    def end(self, holder: str, epoch: int) -> int | None:
        path = self.path(holder)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if _try_lock(fd):
                return None  # its process is gone (or the file is stale)
            fields = os.pread(fd, 4096, 0).decode(errors="replace").split("\n")
        finally:
            os.close(fd)
        if len(fields) < 5 or fields[0] != holder or fields[3] != "leader":
            return None
        if fields[4] != str(epoch) or not fields[1].isdigit() or not fields[2]:
            return None
        pid = int(fields[1])
        if pid == os.getpid() or process_start(pid) != fields[2]:
            return None  # not that process any more (a reused pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as err:
            log.warning("ha.end_failed", holder=holder, pid=pid, error=str(err))
            return None
        return pid

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
