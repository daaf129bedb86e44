"""The one background-task helper and its one failure policy, and the one event fan-out."""

from __future__ import annotations

import asyncio
import gc

import pytest
import structlog

from gcs.base.background import Background, race, shielded
from gcs.base.errors import Unavailable
from gcs.managers.events import Fanout
from gcs.store.errors import StoreUnavailable


async def _fail(err: BaseException) -> None:
    await asyncio.sleep(0)
    raise err


class TestBackground:
    async def test_a_domain_error_is_a_warning_anything_else_an_error_never_unretrieved(
        self,
    ) -> None:
        """Store and raylet failures are expected in operation (a warning naming the task);
        a bug is an error with its traceback; asyncio never reports an unretrieved one."""
        unretrieved: list[object] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
        work = Background("owner")
        with structlog.testing.capture_logs() as logs:
            work.spawn(_fail(StoreUnavailable("store down")), "write")
            work.spawn(_fail(KeyError("bug")), "step")
            await work.settle()
        gc.collect()
        await asyncio.sleep(0)
        assert unretrieved == []
        by_level = {entry["log_level"]: entry for entry in logs}
        assert by_level["warning"]["task"] == "owner:write"
        assert by_level["warning"]["error"] == "store down"
        assert by_level["error"]["task"] == "owner:step"
        assert isinstance(by_level["error"]["exc_info"], KeyError)
        assert len(work) == 0

    async def test_close_cancels_and_waits_for_every_task(self) -> None:
        work = Background("owner")
        started = asyncio.Event()

        async def forever() -> None:
            started.set()
            await asyncio.Event().wait()

        task = work.spawn(forever(), "forever")
        await started.wait()
        await work.close()
        assert task is not None and task.cancelled() and len(work) == 0

    def test_without_a_loop_the_work_is_dropped_not_leaked(self) -> None:
        async def never() -> None:
            raise AssertionError("must not run")

        assert Background("owner").spawn(never()) is None  # closed: no "never awaited"


class TestFanout:
    def test_listeners_hear_in_subscription_order_and_an_error_reaches_the_emitter(
        self,
    ) -> None:
        heard: list[str] = []

        class Listener:
            def __init__(self, name: str, refuse: bool = False) -> None:
                self.name, self.refuse = name, refuse

            def on_thing(self, thing: str) -> None:
                heard.append(f"{self.name}:{thing}")
                if self.refuse:
                    raise Unavailable("no")

        events: Fanout[Listener] = Fanout(Listener("a"))
        events.subscribe(Listener("b"), Listener("c", refuse=True))
        with pytest.raises(Unavailable):
            for listener in events:
                listener.on_thing("x")
        assert heard == ["a:x", "b:x", "c:x"]
        assert len(list(events)) == 3


async def test_race_returns_when_the_first_ends_and_cancels_the_rest() -> None:
    kept = asyncio.ensure_future(asyncio.Event().wait())

    async def quick() -> str:
        return "first"

    first, loser, shielded_one = await race(quick(), asyncio.Event().wait(), asyncio.shield(kept))
    assert first.result() == "first" and loser.cancelled() and shielded_one.cancelled()
    assert not kept.done(), "a shielded task outlives the race"
    kept.cancel()


async def test_shielded_work_finishes_although_its_caller_was_cancelled() -> None:
    gate, finished = asyncio.Event(), []

    async def write_then_apply() -> None:
        await gate.wait()
        finished.append(True)

    caller = asyncio.ensure_future(shielded(write_then_apply()))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0)
    assert not caller.done(), "the caller waits for the work before it is cancelled"
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert finished == [True]
