"""Option ``lost_bundle_replacement`` (ray#40212): a RESCHEDULING group's lost bundles honour
its strategy relative to the nodes holding its surviving bundles. Off = Ray 2.60."""

from __future__ import annotations

from dataclasses import replace

from gcs.policy.autoscaling.scheduler import GangRequest, Options, ResourceDemand, schedule
from tests.autoscaler.builders import inp, ntype, running

PG = ("_PG_pg1", "")


def gang(strategy: str, *cpus: float, survivors: tuple[str, ...] = ()) -> GangRequest:
    aff = PG if strategy == "STRICT_PACK" else None
    anti = PG if strategy == "STRICT_SPREAD" else None
    bundles = tuple(ResourceDemand({"CPU": c}, 1, (), aff, anti) for c in cpus)
    return GangRequest(bundles, f"pg1:{strategy}|RESCHEDULING", (), strategy, True, survivors)


def run(nodes: list, g: GangRequest, on: bool, mx: int = 10):  # type: ignore[no-untyped-def]
    opts = Options(lost_bundle_replacement=on)
    return schedule(replace(inp([ntype("cpu", mx=mx)], nodes, options=opts), gangs=(g,)))


class TestStrictPack:
    """Lost STRICT_PACK bundles must join the survivors' node."""

    def test_fit_on_survivor_node_places_them_there(self) -> None:
        """Survivor node has room: placed, nothing launched, a reason names the node."""
        nodes = [running("a", free=2, labels={PG[0]: ""}), running("b")]
        reply = run(nodes, gang("STRICT_PACK", 1, 1), on=True)
        assert reply.infeasible_gangs == () and reply.launches == {}
        assert any(d.action == "replace" and "a" in d.reason for d in reply.reasons)

    def test_no_room_on_survivor_node_is_infeasible_with_reason(self) -> None:
        """Survivor node has 1 CPU free for 2 CPU of lost bundles: infeasible, no launch.

        Ray puts them on another node, where the GCS cannot use them for a STRICT_PACK group.
        """
        nodes = [running("a", free=1, labels={PG[0]: ""}), running("b")]
        on = run(nodes, gang("STRICT_PACK", 1, 1), on=True)
        assert len(on.infeasible_gangs) == 1 and on.launches == {}
        why = next(d.reason for d in on.reasons if d.action == "infeasible")
        assert "must join its surviving bundles on a" in why and "lack room" in why
        off = run(nodes, gang("STRICT_PACK", 1, 1), on=False)
        assert off.infeasible_gangs == ()  # Ray: placed on b

    def test_survivors_named_by_id_count_like_labelled_ones(self) -> None:
        """``survivor_nodes`` (instance or Ray node id) marks survivors without the label."""
        nodes = [running("a", free=1), running("b")]
        by_ray_id = run(nodes, gang("STRICT_PACK", 1, 1, survivors=("ra",)), on=True)
        assert len(by_ray_id.infeasible_gangs) == 1

    def test_unknown_survivors_fall_back_to_ray(self) -> None:
        """No label, no ids: nothing known about the survivors, Ray's packing is used."""
        nodes = [running("a", free=1)]
        reply = run(nodes, gang("STRICT_PACK", 1, 1), on=True)
        assert reply.infeasible_gangs == () and reply.launches == {"cpu": 1}


class TestStrictSpread:
    """Lost STRICT_SPREAD bundles must avoid the survivors' nodes."""

    def test_survivor_node_is_avoided(self) -> None:
        """Only node a (a survivor, named by id) has room: on -> launch; off -> Ray uses a."""
        nodes = [running("a", free=4)]
        g = gang("STRICT_SPREAD", 1, survivors=("a",))
        assert run(nodes, g, on=False).launches == {}
        on = run(nodes, g, on=True)
        assert on.launches == {"cpu": 1}
        assert any(d.action == "replace" and "away from a" in d.reason for d in on.reasons)

    def test_no_other_node_allowed_is_infeasible_with_reason(self) -> None:
        """max_workers reached and the only room is on the survivor: infeasible."""
        nodes = [running("a", free=4)]
        on = run(nodes, gang("STRICT_SPREAD", 1, survivors=("a",)), on=True, mx=1)
        assert len(on.infeasible_gangs) == 1
        assert any("other than a" in d.reason for d in on.reasons)


class TestOtherGroups:
    """The option changes nothing else."""

    def test_pending_group_and_pack_strategy_are_unchanged(self) -> None:
        """Not RESCHEDULING, or no strict strategy: same reply with the option on or off."""
        nodes = [running("a", free=1, labels={PG[0]: ""}), running("b")]
        pending = replace(gang("STRICT_PACK", 1, 1), rescheduling=False)
        bundles = (ResourceDemand({"CPU": 1}, 2),)
        pack = GangRequest(bundles, "pg1:PACK|RESCHEDULING", (), "PACK", True)
        for g in (pending, pack):
            on, off = run(nodes, g, on=True), run(nodes, g, on=False)
            assert (on.launches, on.infeasible_gangs) == (off.launches, off.infeasible_gangs)
