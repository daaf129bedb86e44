"""No manager hands out what it changes: the actor manager answers copies, and no manager of
a built GCS exposes a mutable dict, list or set as a public attribute."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict

import structlog

from gcs.managers.actors import ActorManager, states
from gcs.managers.actors.scheduler import Attempt, Created, Failed
from gcs.testing.actors import FakeActorGateway
from tests.actors.harness import Harness, actor_spec, turns_until
from tests.server.wiring_support import built_wiring

MUTABLE = (dict, list, set, OrderedDict)
KNOWN_MUTABLE = {
    ("resources", "nodes"),  # ResourceCache: read by ~27 callers; its own step
    ("resources", "job_demand"),
}
"""Public mutable attributes of other managers, still to be made read-only.  An entry that
is no longer mutable fails the test: take it off the list."""


class TestActorQueriesAnswerCopies:
    async def test_changing_what_get_returned_changes_nothing(self) -> None:
        """``get()`` returns a copy: a caller's edits never reach the manager's state."""
        h = await Harness().start(1)
        actor = await h.create(actor_spec(1, name="a"))
        got = h.actors.get(actor.actor_id)
        assert got is not None
        got.state = states.DEAD
        got.name = "stolen"
        again = h.actors.get(actor.actor_id)
        assert again is not None and again.state == states.ALIVE and again.name == "a"
        assert h.actors.get_named("a", "ns").actor_id == actor.actor_id

    async def test_named_lookups_specs_and_listings_are_copies_too(self) -> None:
        h = await Harness().start(1)
        spec = actor_spec(1, name="a")
        actor = await h.create(spec)
        h.actors.get_named("a", "ns").state = states.DEAD
        spec_copy = h.actors.spec_of(actor.actor_id)
        assert spec_copy == spec
        spec_copy.actor_creation_task_spec.name = "other"
        (listed,), total, _ = h.actors.list_all()
        listed.state = states.DEAD
        assert total == 1
        assert h.actors.get(actor.actor_id).state == states.ALIVE
        assert h.actors.spec_of(actor.actor_id) == spec

    async def test_the_manager_holds_no_public_dict_of_actors_specs_or_names(self) -> None:
        h = await Harness().start(1)
        await h.create(actor_spec(1, name="a"))
        for name in ("actors", "specs", "named"):
            assert not hasattr(h.actors, name), name
        assert _public_mutables(h.actors) == []


class TestEveryManagerOfABuiltGcs:
    def test_no_manager_exposes_a_mutable_dict_list_or_set(self) -> None:
        wiring = built_wiring(actor_gateway=FakeActorGateway())
        found = set()
        for field in (f.name for f in dataclasses.fields(wiring.managers)):
            if field == "raylets":  # the raylet I/O gateway (a recording fake here)
                continue
            manager = getattr(wiring.managers, field)
            found |= {(field, attr) for attr in _public_mutables(manager)}
        assert found == KNOWN_MUTABLE


class TestCreationAttemptsRunUnderBackground:
    async def test_an_attempt_that_crashes_is_logged_by_the_failure_policy(self) -> None:
        """A creation attempt is a task of ``Background`` (its one failure policy), not a
        raw task with a callback of its own."""

        class Broken:
            async def run(self, attempt: Attempt) -> Created | Failed:
                raise RuntimeError("scheduler bug")

        h = await Harness().start(1)
        manager = ActorManager(h.store, h.clock, Broken(), h.gateway, h.nodes.alive)  # type: ignore[arg-type]
        spec = actor_spec(2)
        await manager.register(spec)
        with structlog.testing.capture_logs() as logs:
            creating = asyncio.ensure_future(manager.create(spec))
            await turns_until(lambda: any(e["event"] == "background.failed" for e in logs))
        (failed,) = [e for e in logs if e["event"] == "background.failed"]
        assert failed["log_level"] == "error"
        assert failed["task"] == f"actors.scheduling:{spec.actor_creation_task_spec.actor_id.hex()}"
        creating.cancel()
        await manager.close()


def _public_mutables(obj: object) -> list[str]:
    return (
        sorted(
            name
            for name, value in vars(obj).items()
            if not name.startswith("_") and isinstance(value, MUTABLE)
        )
        if hasattr(obj, "__dict__")
        else []
    )
