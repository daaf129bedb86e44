"""Crash durability of SQLite: a write that returned survives kill -9 of the writer."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

from gcs.store.sql.store import SqlStore

_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from gcs.store import WriteBatch
    from gcs.store.sql.store import SqlStore

    async def main(url):
        store = SqlStore(url, namespace="crash")
        await store.open()
        for i in range(1_000_000):
            key = str(i).encode()
            await store.write(WriteBatch().put("KV", key, key).put("NODE", key, b"n"))
            value = await store.increment("c")
            print(i, value, flush=True)  # printed only after both were acknowledged

    asyncio.run(main(sys.argv[1]))
    """
)


class TestSqliteCrash:
    """WAL + synchronous=FULL: acknowledged writes are on disk when the process dies."""

    def test_acknowledged_writes_survive_kill_9_of_the_writer(self, tmp_path: pathlib.Path) -> None:
        """A writer process is SIGKILLed mid-load; every write it acknowledged is present
        after reopening, and the counter is at least the last acknowledged value."""
        url = f"sqlite:///{tmp_path / 'crash.db'}"
        root = pathlib.Path(__file__).resolve().parents[2]
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, url],
            stdout=subprocess.PIPE,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        assert proc.stdout is not None
        acked: list[tuple[int, int]] = []
        for line in proc.stdout:
            index, value = map(int, line.split())
            acked.append((index, value))
            if len(acked) == 150:
                os.kill(proc.pid, signal.SIGKILL)
                break
        acked += [tuple(map(int, line.split())) for line in proc.stdout]  # type: ignore[misc]
        proc.wait(timeout=10)
        assert len(acked) >= 150, "writer died before the kill"

        async def check() -> None:
            async with SqlStore(url, namespace="crash") as store:
                kv = await store.get_all("KV")
                nodes = await store.get_all("NODE")
                for index, _ in acked:
                    key = str(index).encode()
                    assert kv.get(key) == key and key in nodes
                assert await store.read_counter("c") >= acked[-1][1]

        asyncio.run(check())
