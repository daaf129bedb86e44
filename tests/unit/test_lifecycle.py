"""The supervisor: load in order, run together, first failure stops all, close in reverse."""

from __future__ import annotations

import asyncio

import pytest

from gcs.base.lifecycle import Component, ComponentFailed, Supervisor, start_until_ready


class Recorder:
    def __init__(self, name: str, log: list[str], *, fail_load: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail_load = fail_load
        self.fail_run = asyncio.Event()
        self.finish = asyncio.Event()
        self.running = asyncio.Event()

    async def load(self) -> None:
        self.log.append(f"load {self.name}")
        if self.fail_load:
            raise RuntimeError("no store")

    async def run(self) -> None:
        self.log.append(f"run {self.name}")
        self.running.set()
        try:
            waits = [asyncio.ensure_future(e.wait()) for e in (self.fail_run, self.finish)]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if self.fail_run.is_set():
                raise RuntimeError(f"{self.name} broke")
        except asyncio.CancelledError:
            self.log.append(f"cancelled {self.name}")
            raise

    async def close(self) -> None:
        self.log.append(f"close {self.name}")


def test_a_recorder_is_a_component() -> None:
    assert isinstance(Recorder("a", []), Component)


async def test_load_in_order_close_in_reverse() -> None:
    log: list[str] = []
    a, b = Recorder("a", log), Recorder("b", log)
    sup = Supervisor([a, b])
    await sup.load()
    a.finish.set()
    b.finish.set()
    await sup.run()
    await sup.close()
    await sup.close()  # idempotent
    assert log == ["load a", "load b", "run a", "run b", "close b", "close a"]


async def test_a_failed_load_closes_what_was_loaded_and_names_the_component() -> None:
    log: list[str] = []
    sup = Supervisor([Recorder("a", log), Recorder("b", log, fail_load=True), Recorder("c", log)])
    with pytest.raises(ComponentFailed) as failed:
        await sup.load()
    assert (failed.value.name, failed.value.phase) == ("b", "load")
    assert log == ["load a", "load b", "close b", "close a"]


async def test_the_first_failure_cancels_the_others() -> None:
    log: list[str] = []
    a, b = Recorder("a", log), Recorder("b", log)
    sup = Supervisor([a, b])
    await sup.load()
    running = asyncio.create_task(sup.run())
    await a.running.wait()
    await b.running.wait()
    b.fail_run.set()
    with pytest.raises(ComponentFailed) as failed:
        await running
    assert (failed.value.name, failed.value.phase) == ("b", "run")
    assert "cancelled a" in log


async def test_stop_cancels_every_component_and_returns() -> None:
    log: list[str] = []
    a, b = Recorder("a", log), Recorder("b", log)
    sup = Supervisor([a, b])
    await sup.load()
    running = asyncio.create_task(sup.run())
    await a.running.wait()
    await b.running.wait()
    sup.stop()
    await running
    assert {"cancelled a", "cancelled b"} <= set(log)


def test_names_are_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        Supervisor([Recorder("a", []), Recorder("a", [])])


async def test_start_until_ready_returns_the_running_task_once_ready() -> None:
    """ "Start, then wait until serving", written once: the task keeps running when ready
    came first; it is returned done (ready cancelled) when it ended first."""
    ready, stop = asyncio.Event(), asyncio.Event()
    waits: list[str] = []

    async def serve() -> None:
        ready.set()
        await stop.wait()

    async def until_ready(event: asyncio.Event) -> None:
        try:
            await event.wait()
        except asyncio.CancelledError:
            waits.append("cancelled")
            raise

    running = await start_until_ready(serve(), until_ready(ready), name="t")
    assert not running.done() and running.get_name() == "t"
    stop.set()
    await running

    async def fails() -> None:
        raise RuntimeError("failed before serving")

    ended = await start_until_ready(fails(), until_ready(asyncio.Event()), name="t2")
    assert ended.done() and waits == ["cancelled"]
    with pytest.raises(RuntimeError, match="before serving"):
        await ended
