"""A small asyncio TCP proxy between one HA member and its store: the partition suite's
faults (``bench/ha/partitions.py``, ``tests/server/test_ha_partitions.py``).

One proxy per member; the member's ``--storage`` URL names the proxy's port.  Faults apply
to every connection through it, now and later:

* ``blackhole()``: bytes are held, not delivered, either way (packets dropped; TCP would
  retransmit them once the link heals, so they are delivered at :meth:`heal`);
* ``latency(to_store_s, from_store_s)``: each chunk is delivered that long after it was read
  (latency both ways, or one way with the other 0), in order;
* ``cut()``: every connection is closed now (a reset); new ones are accepted.

The proxy runs on its own thread's event loop, so a test or bench on another loop (or none)
drives it by plain method calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

__all__ = ["LinkFaults", "TcpProxy"]


@dataclass
class LinkFaults:
    to_store_s: float = 0.0
    from_store_s: float = 0.0
    blackholed: bool = False


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._host = host
        self.port = 0
        self.faults = LinkFaults()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._healed: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- control (any thread) ------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def url(self, db: int = 0) -> str:
        return f"redis://{self._host}:{self.port}/{db}"

    def blackhole(self) -> None:
        self._call(self._set_blackhole, True)

    def latency(self, to_store_s: float, from_store_s: float) -> None:
        self.faults.to_store_s, self.faults.from_store_s = to_store_s, from_store_s

    def heal(self) -> None:
        self.latency(0.0, 0.0)
        self._call(self._set_blackhole, False)

    def cut(self) -> None:
        self._call(self._cut)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, fn: object, *args: object) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args)  # type: ignore[operator]
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    # -- on the proxy's loop -------------------------------------------------------------
    async def _start(self) -> None:
        self._healed = asyncio.Event()
        self._healed.set()
        self._server = await asyncio.start_server(self._accept, self._host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def _set_blackhole(self, on: bool) -> None:
        assert self._healed is not None
        self.faults.blackholed = on
        if on:
            self._healed.clear()
        else:
            self._healed.set()

    def _cut(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        pair = (
            asyncio.ensure_future(self._pump(reader, up_writer, to_store=True)),
            asyncio.ensure_future(self._pump(up_reader, writer, to_store=False)),
        )
        self._tasks.update(pair)
        try:
            await asyncio.wait(pair, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pair:
                task.cancel()
            await asyncio.gather(*pair, return_exceptions=True)
            self._tasks.difference_update(pair)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_store: bool
    ) -> None:
        """Read chunks and deliver each at its due time (read time + the direction's
        latency then), in order; held while blackholed."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.ensure_future(self._deliver(queue, writer))
        try:
            while data := await reader.read(65536):
                delay = self.faults.to_store_s if to_store else self.faults.from_store_s
                queue.put_nowait((time.monotonic() + delay, data))
            await queue.join()
        finally:
            deliver.cancel()
            await asyncio.gather(deliver, return_exceptions=True)

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        assert self._healed is not None
        while True:
            due, data = await queue.get()
            await self._healed.wait()
            wait_s = due - time.monotonic()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            await self._healed.wait()
            writer.write(data)
            await writer.drain()
            queue.task_done()
