"""Local resource accounting: grant, queue, infeasible, FIFO, resize, load rows."""

from __future__ import annotations

import pytest

from gcs.raylet.resources import (
    LABEL_IN,
    LABEL_NOT_IN,
    LeaseRequest,
    LocalResources,
    Placement,
    selector_matches,
)
from gcs.rpc.errors import InvalidArgument, NotFound


def lease(name: str, backlog: int = 0, selector: tuple = (), **shape: float) -> LeaseRequest:
    return LeaseRequest(name.encode(), shape, selector, backlog)


class TestPlacement:
    """Each request is granted, queued or infeasible on arrival."""

    def test_a_request_that_fits_available_is_granted(self) -> None:
        """Fitting resources are taken at once."""
        node = LocalResources({"CPU": 4})
        assert node.submit(lease("a", CPU=3)) is Placement.GRANTED
        assert node.available == {"CPU": 1}
        assert node.busy

    def test_a_request_that_fits_totals_but_not_available_is_queued(self) -> None:
        """It waits for resources to free up."""
        node = LocalResources({"CPU": 4})
        node.submit(lease("a", CPU=3))
        assert node.submit(lease("b", CPU=2)) is Placement.QUEUED
        assert node.available == {"CPU": 1}

    def test_a_request_larger_than_totals_or_naming_a_missing_resource_is_infeasible(self) -> None:
        """It can never run on this node."""
        node = LocalResources({"CPU": 4})
        assert node.submit(lease("a", CPU=5)) is Placement.INFEASIBLE
        assert node.submit(lease("b", GPU=1)) is Placement.INFEASIBLE
        assert not node.busy

    def test_a_selector_that_does_not_match_the_labels_is_infeasible(self) -> None:
        """Label selectors restrict which nodes can ever run a task."""
        node = LocalResources({"CPU": 4}, labels={"zone": "a"})
        wrong = lease("a", selector=(("zone", LABEL_IN, ("b",)),), CPU=1)
        right = lease("b", selector=(("zone", LABEL_NOT_IN, ("b",)),), CPU=1)
        assert node.submit(wrong) is Placement.INFEASIBLE
        assert node.submit(right) is Placement.GRANTED

    def test_a_small_request_does_not_overtake_an_older_queued_one(self) -> None:
        """Grants are FIFO: a request waits while an older ready request waits."""
        node = LocalResources({"CPU": 4})
        node.submit(lease("a", CPU=3))
        node.submit(lease("b", CPU=2))
        assert node.submit(lease("c", CPU=1)) is Placement.QUEUED

    def test_a_lease_id_cannot_be_submitted_twice(self) -> None:
        """Lease ids identify returns and cancels."""
        node = LocalResources({"CPU": 4})
        node.submit(lease("a", CPU=1))
        with pytest.raises(InvalidArgument):
            node.submit(lease("a", CPU=1))


class TestRelease:
    """Returning a lease frees resources and grants waiting requests in order."""

    def test_release_grants_queued_requests_in_fifo_order(self) -> None:
        """The oldest ready request goes first; grants stop at the first that does not fit."""
        node = LocalResources({"CPU": 4})
        node.submit(lease("a", CPU=4))
        for name, cpu in (("b", 2), ("c", 1), ("d", 3), ("e", 1)):
            node.submit(lease(name, CPU=cpu))
        assert node.release(b"a") == [b"b", b"c"]
        assert node.state_of(b"d") is Placement.QUEUED
        assert node.state_of(b"e") is Placement.QUEUED
        assert node.available == {"CPU": 1}

    def test_releasing_an_unknown_lease_is_not_found(self) -> None:
        """Only granted leases can be returned."""
        with pytest.raises(NotFound):
            LocalResources({"CPU": 1}).release(b"x")

    def test_cancel_drops_a_waiting_request(self) -> None:
        """Cancelled requests no longer count as demand."""
        node = LocalResources({"CPU": 1})
        node.submit(lease("a", CPU=2))
        assert node.cancel(b"a")
        assert node.load() == ({}, [])
        assert not node.cancel(b"a")


class TestLoad:
    """Queued demand is summarised per (shape, selector)."""

    def test_rows_count_ready_infeasible_and_backlog_per_shape(self) -> None:
        """resource_load sums every waiting shape; rows group identical shapes."""
        node = LocalResources({"CPU": 2})
        node.submit(lease("a", CPU=2))
        node.submit(lease("b", backlog=3, CPU=1))
        node.submit(lease("c", backlog=1, CPU=1))
        node.submit(lease("d", CPU=8))
        summed, rows = node.load()
        assert summed == {"CPU": 10}
        assert [(r.shape, r.ready, r.infeasible, r.backlog_size) for r in rows] == [
            ({"CPU": 1}, 2, 0, 4),
            ({"CPU": 8}, 0, 1, 0),
        ]

    def test_different_selectors_are_different_rows(self) -> None:
        """A selector is part of the demand key."""
        node = LocalResources({"CPU": 1}, labels={"zone": "a"})
        node.submit(lease("a", CPU=1))
        node.submit(lease("b", CPU=1))
        node.submit(lease("c", selector=(("zone", LABEL_IN, ("a",)),), CPU=1))
        _, rows = node.load()
        assert [(r.selector, r.ready) for r in rows] == [
            ((), 1),
            ((("zone", LABEL_IN, ("a",)),), 1),
        ]


class TestResize:
    """Resizing keeps in-use amounts and validates the whole request first."""

    def test_resize_keeps_in_use_amounts_and_grants_waiting_requests(self) -> None:
        """New availability = new total - in use; a queued request may now fit."""
        node = LocalResources({"CPU": 2, "memory": 100})
        node.submit(lease("a", CPU=2))
        node.submit(lease("b", CPU=1))
        assert node.resize({"CPU": 3}) == [b"b"]
        assert node.total == {"CPU": 3, "memory": 100}
        assert node.available["CPU"] == 0

    def test_resize_turns_infeasible_requests_ready_when_they_now_fit(self) -> None:
        """Growing totals re-checks infeasible requests."""
        node = LocalResources({"CPU": 2})
        node.submit(lease("a", CPU=4))
        assert node.resize({"CPU": 4}) == [b"a"]

    def test_shrink_is_clamped_to_what_is_free(self) -> None:
        """Ray's ResizeLocalResourceInstances: delta >= -available, so in-use stays."""
        node = LocalResources({"CPU": 4, "memory": 100})
        node.submit(lease("a", CPU=3))
        node.resize({"CPU": 1, "memory": 40})
        assert node.total == {"CPU": 3, "memory": 40}
        assert node.available == {"CPU": 0, "memory": 40}

    @pytest.mark.parametrize("request_", [{"foo": 5}, {"GPU": 1}, {"CPU": -1}])
    def test_unknown_unit_instance_or_negative_resources_are_refused(self, request_) -> None:
        """GPU is a unit-instance resource; unknown names are refused; nothing changes."""
        node = LocalResources({"CPU": 2, "GPU": 1})
        with pytest.raises(InvalidArgument):
            node.resize({"CPU": 8, **request_})
        assert node.total == {"CPU": 2, "GPU": 1}


class TestSelectorMatching:
    """IN needs one of the values; NOT_IN needs none (a missing key passes NOT_IN)."""

    def test_in_and_not_in(self) -> None:
        """The operators behave like Ray's label selectors."""
        labels = {"zone": "a"}
        assert selector_matches([("zone", LABEL_IN, ("a", "b"))], labels)
        assert not selector_matches([("zone", LABEL_IN, ("b",))], labels)
        assert not selector_matches([("zone", LABEL_NOT_IN, ("a",))], labels)
        assert selector_matches([("gpu", LABEL_NOT_IN, ("a100",))], labels)
        assert not selector_matches([("gpu", LABEL_IN, ("a100",))], labels)
