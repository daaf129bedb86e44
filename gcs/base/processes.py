"""Facts about local processes, shared by whoever supervises them (the head's children,
the local autoscaler provider)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from pathlib import Path

__all__ = ["pid_alive", "set_process_name"]

_PR_SET_NAME = 15  # <linux/prctl.h>


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as gone
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
    return True


def set_process_name(name: str) -> bool:
    """Set this process's name as the kernel shows it (``/proc/<pid>/comm``, what ``ps -o
    comm``, ``pkill`` and psutil's ``Process.name()`` read; at most 15 bytes on Linux).

    Ray's ``ray stop`` finds its GCS by that name (``["gcs_server", True]`` in
    ``RAY_PROCESSES``: by name, not command line): a drop-in GCS run by ``python`` is
    otherwise never stopped, and the next ``ray start --head`` finds port 6379 taken.
    False where the platform has no such call (the name is then the interpreter's)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's prctl
    return bool(libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0) == 0)
