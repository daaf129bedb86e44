"""The actor state table and the pure node choice."""

from __future__ import annotations

import pytest

from gcs.managers.actors import states
from gcs.managers.actors.placement import Candidate, Demand, choose_node
from gcs.proto import common_pb2, gcs_pb2

Actor = gcs_pb2.ActorTableData


def nid(n: int) -> bytes:
    return bytes([n]) * 28


def node(n: int, total: float = 4, available: float | None = None, **kw: object) -> Candidate:
    return Candidate(
        nid(n),
        {"CPU": total},
        {"CPU": total if available is None else available},
        **kw,  # type: ignore[arg-type]
    )


def demand(
    cpus: float = 1, strategy: common_pb2.SchedulingStrategy | None = None, **kw: object
) -> Demand:
    default = common_pb2.SchedulingStrategy()
    return Demand({"CPU": cpus}, strategy or default, **kw)  # type: ignore[arg-type]


class TestStateTable:
    def test_every_state_has_a_row(self) -> None:
        assert set(states.TRANSITIONS) == set(Actor.ActorState.values())

    @pytest.mark.parametrize("old", Actor.ActorState.values())
    @pytest.mark.parametrize("new", Actor.ActorState.values())
    def test_only_listed_edges_pass(self, old: int, new: int) -> None:
        if new in states.TRANSITIONS[old]:
            states.check_transition(b"\1" * 16, old, new)
        else:
            with pytest.raises(states.IllegalTransition):
                states.check_transition(b"\1" * 16, old, new)

    def test_dead_is_final_except_for_lineage_restart(self) -> None:
        assert states.TRANSITIONS[states.DEAD] == {states.RESTARTING}

    def test_remaining_restarts(self) -> None:
        assert states.remaining_restarts(Actor(max_restarts=-1, num_restarts=99)) is None
        assert states.remaining_restarts(Actor(max_restarts=2, num_restarts=1)) == 1
        assert states.remaining_restarts(Actor(max_restarts=2, num_restarts=5)) == 0
        preempted = Actor(max_restarts=1, num_restarts=3, num_restarts_due_to_node_preemption=2)
        assert states.remaining_restarts(preempted) == 0
        assert (
            states.remaining_restarts(
                Actor(max_restarts=1, num_restarts=2, num_restarts_due_to_node_preemption=2)
            )
            == 1
        )


class TestChooseNode:
    def test_prefers_the_owner_node_when_it_has_room(self) -> None:
        assert choose_node(demand(owner_node_id=nid(2)), [node(1), node(2)]).node_id == nid(2)

    def test_else_the_least_utilised_ready_node(self) -> None:
        nodes = [node(1, available=1), node(2, available=3), node(3, available=0)]
        assert choose_node(demand(owner_node_id=nid(3)), nodes).node_id == nid(2)

    def test_busy_but_feasible_nodes_get_it_when_none_is_ready(self) -> None:
        nodes = [node(1, available=0), node(2, available=0.5)]
        assert choose_node(demand(), nodes).node_id == nid(2)

    def test_no_feasible_node_queues_at_the_owner_node_with_a_reason(self) -> None:
        placement = choose_node(demand(cpus=16, owner_node_id=nid(2)), [node(1), node(2)])
        assert placement.node_id is None and not placement.fatal
        assert placement.reason == "no node can fit {CPU: 16}"
        assert placement.queue_at == nid(2)
        assert choose_node(demand(cpus=16), [node(3), node(1)]).queue_at == nid(1)
        assert choose_node(demand(cpus=16), []).queue_at is None

    def test_draining_excluded_and_out_of_cluster_nodes_are_skipped(self) -> None:
        nodes = [node(1, draining=True), node(2), node(3)]
        got = choose_node(demand(excluded=frozenset({nid(2)})), nodes)
        assert got.node_id == nid(3)
        got = choose_node(demand(allowed_nodes=frozenset({nid(2)})), nodes)
        assert got.node_id == nid(2)

    def test_spread_balances_our_actors(self) -> None:
        strategy = common_pb2.SchedulingStrategy(
            spread_scheduling_strategy=common_pb2.SpreadSchedulingStrategy()
        )
        nodes = [node(1, actors=2), node(2, actors=1), node(3, actors=1)]
        assert choose_node(demand(strategy=strategy), nodes).node_id == nid(2)

    def test_node_affinity(self) -> None:
        strategy = common_pb2.SchedulingStrategy()
        affinity = strategy.node_affinity_scheduling_strategy
        affinity.node_id = nid(2)
        assert choose_node(demand(strategy=strategy), [node(1), node(2)]).node_id == nid(2)
        gone = choose_node(demand(strategy=strategy), [node(1)])
        assert gone.fatal and gone.node_id is None
        busy = choose_node(demand(strategy=strategy), [node(1), node(2, draining=True)])
        assert not busy.fatal and busy.node_id is None
        affinity.soft = True
        assert choose_node(demand(strategy=strategy), [node(1)]).node_id == nid(1)

    def test_placement_group_bundle_node(self) -> None:
        pg = b"\7" * 18
        strategy = common_pb2.SchedulingStrategy()
        strategy.placement_group_scheduling_strategy.placement_group_id = pg
        strategy.placement_group_scheduling_strategy.placement_group_bundle_index = 1
        nodes = [node(1, bundles=frozenset({(pg, 0)})), node(2, bundles=frozenset({(pg, 1)}))]
        assert choose_node(demand(strategy=strategy), nodes).node_id == nid(2)
        strategy.placement_group_scheduling_strategy.placement_group_bundle_index = -1
        assert choose_node(demand(strategy=strategy), nodes).node_id == nid(1)
        unplaced = choose_node(demand(strategy=strategy), [node(3)])
        assert unplaced.node_id is None and "is not placed" in unplaced.reason


def _selector(key: str, op: int, *values: str) -> common_pb2.LabelSelector:
    return common_pb2.LabelSelector(
        label_constraints=[
            common_pb2.LabelSelectorConstraint(label_key=key, operator=op, label_values=values)
        ]
    )


class TestLabelSelector:
    """Ray's job supervisor pins itself to the head with ``ray.io/node-id``."""

    def test_an_in_selector_picks_the_labelled_node_over_the_owners(self) -> None:
        nodes = [node(1, labels={"ray.io/node-id": "aa"}), node(2, labels={"ray.io/node-id": "bb"})]
        pick = choose_node(
            demand(
                owner_node_id=nid(1),
                label_selector=_selector("ray.io/node-id", common_pb2.LABEL_OPERATOR_IN, "bb"),
            ),
            nodes,
        )
        assert pick.node_id == nid(2)

    def test_not_in_also_matches_nodes_without_the_label(self) -> None:
        nodes = [node(1, labels={"zone": "a"}), node(2)]
        selector = _selector("zone", common_pb2.LABEL_OPERATOR_NOT_IN, "a")
        assert choose_node(demand(label_selector=selector), nodes).node_id == nid(2)

    def test_no_matching_node_waits(self) -> None:
        selector = _selector("ray.io/node-id", common_pb2.LABEL_OPERATOR_IN, "gone")
        pick = choose_node(demand(label_selector=selector), [node(1), node(2)])
        assert pick.node_id is None and not pick.fatal and "label selector" in pick.reason
