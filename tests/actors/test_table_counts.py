"""The actor table's ALIVE-actors-per-node count, kept as actors are put, always equals a
scan of every actor held (a creation reads it; the scan it replaces made each creation cost
as many steps as actors held: 32 % of the GCS's samples at 5,000 actors)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gcs.managers.actors import states
from gcs.managers.actors.table import ActorTable
from gcs.proto import gcs_pb2

STATES = [
    states.DEPENDENCIES_UNREADY,
    states.PENDING_CREATION,
    states.ALIVE,
    states.RESTARTING,
    states.DEAD,
]
NODES = [b"", b"n1", b"n2", b"n3"]


def scanned(table: ActorTable) -> dict[bytes, int]:
    counts: dict[bytes, int] = {}
    for actor in table.actors.values():
        if actor.state == states.ALIVE and actor.node_id:
            counts[actor.node_id] = counts.get(actor.node_id, 0) + 1
    return counts


steps = st.lists(
    st.tuples(
        st.sampled_from(["put", "evict"]),
        st.integers(0, 5),
        st.sampled_from(STATES),
        st.sampled_from(NODES),
    ),
    max_size=60,
)


@settings(deadline=None)
@given(steps)
def test_the_count_is_the_scan_after_any_puts_and_evictions(
    ops: list[tuple[str, int, int, bytes]],
) -> None:
    table = ActorTable(max_dead=3)
    for op, n, state, node in ops:
        actor_id = bytes([n]) * 16
        if op == "put":
            table.put(gcs_pb2.ActorTableData(actor_id=actor_id, state=state, node_id=node))
        else:
            table.evict([actor_id])
        assert table.actors_per_node() == scanned(table)


def test_a_copy_is_returned() -> None:
    table = ActorTable(max_dead=3)
    table.put(gcs_pb2.ActorTableData(actor_id=b"a" * 16, state=states.ALIVE, node_id=b"n1"))
    counts = table.actors_per_node()
    counts[b"n1"] = 99
    assert table.actors_per_node() == {b"n1": 1}
