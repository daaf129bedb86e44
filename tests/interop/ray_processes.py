"""Running real Ray processes in interop tests: their environment and their cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal


def ray_env() -> dict[str, str]:
    """The environment for ``ray`` commands and drivers (no PYTHONPATH to our checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1")
    return env


async def stop_group(proc: asyncio.subprocess.Process) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started
    (its process group): SIGTERM, then SIGKILL after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout=20)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
