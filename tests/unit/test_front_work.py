"""The front door's own work: every task through a Background, every timer on the injected
clock (gcs.front.deadlines), checked over the source and driven with a FakeClock."""

from __future__ import annotations

import ast
from pathlib import Path

from gcs.base.background import Background
from gcs.base.clock import FakeClock
from gcs.front.deadlines import Deadlines

ROOT = Path(__file__).resolve().parents[2]
OWNED = sorted(
    [
        *(ROOT / "gcs/front").glob("*.py"),
        ROOT / "gcs/services/pubsub.py",
        ROOT / "gcs/services/ray_syncer.py",
        ROOT / "gcs/services/pubsub_runtime.py",
        ROOT / "gcs/server/rpc_server.py",
    ]
)
RAW = {"create_task", "ensure_future", "call_later", "call_at"}
"""Task and timer calls that bypass Background and the clock."""


def raw_work(source: str) -> list[str]:
    """``name:line`` of each raw task / timer call and each wall-clock sleep."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = node.func.attr
        owner = node.func.value
        wall_sleep = (
            name == "sleep"
            and isinstance(owner, ast.Name)
            and owner.id
            in (
                "asyncio",
                "time",
            )
        )
        if name in RAW or wall_sleep:
            found.append((node.lineno, name))
    return [f"{name}:{line}" for line, name in sorted(found)]


class TestNoRawWork:
    def test_the_checker_sees_each_kind(self) -> None:
        """The checker itself: each raw call is found, the clock's and Background's not."""
        source = (
            "loop.create_task(x)\nasyncio.ensure_future(x)\nloop.call_later(1, f)\n"
            "await asyncio.sleep(1)\ntime.sleep(1)\nawait clock.sleep(1)\nbg.spawn(x)\n"
        )
        assert raw_work(source) == [
            "create_task:1",
            "ensure_future:2",
            "call_later:3",
            "sleep:4",
            "sleep:5",
        ]

    def test_front_and_its_handlers_start_no_raw_task_nor_wall_timer(self) -> None:
        """gcs/front and the pubsub / syncer / port files: tasks through Background,
        sleeps and deadlines on the injected clock."""
        offenders = {
            str(path.relative_to(ROOT)): found
            for path in OWNED
            if (found := raw_work(path.read_text()))
        }
        assert offenders == {}


class TestDeadlines:
    async def test_deadlines_fire_in_order_on_the_clock(self) -> None:
        """Nothing fires before its time; each fires once when the clock passes it, in
        order; a cancelled one never fires."""
        clock, background = FakeClock(), Background("test")
        deadlines = Deadlines(clock, background)
        fired: list[str] = []
        deadlines.add(5.0, fired.append, "five")
        deadlines.add(1.0, fired.append, "one")  # earlier: the sleeper restarts
        cancelled = deadlines.add(3.0, fired.append, "three")
        cancelled.cancel()
        await clock.advance_until(lambda: fired == ["one"], 0.5)
        await clock.advance_until(lambda: fired == ["one", "five"], 0.5)
        # nothing is left to fire: the cancelled deadline is gone and the sleeper has ended
        await clock.advance_until(lambda: len(deadlines) == 0 and clock.sleepers == 0, 1.0)
        assert fired == ["one", "five"]
        await background.close()

    async def test_a_deadline_added_while_firing_is_kept(self) -> None:
        """A callback that sets a new deadline (a re-poll) gets it."""
        clock, background = FakeClock(), Background("test")
        deadlines = Deadlines(clock, background)
        fired: list[int] = []

        def again(n: int) -> None:
            fired.append(n)
            if n < 3:
                deadlines.add(1.0, again, n + 1)

        deadlines.add(1.0, again, 1)
        await clock.advance_until(lambda: fired == [1, 2, 3], 0.25)
        await background.close()
