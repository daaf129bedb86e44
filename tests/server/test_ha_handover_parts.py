"""The pure parts of the planned handover and the rolling upgrade (issue 29): the notice
and when a standby tries the lease, the store format's expand / contract / check steps."""

from __future__ import annotations

import pytest

from gcs.server.ha_handover import POLL_S, HandoverNotice, standby_wait_s
from gcs.server.ha_mirror import TableMirror
from gcs.server.ha_upgrade import check_mirror
from gcs.store.base import TABLE_META
from gcs.store.format import (
    FORMAT_KEY,
    FORMAT_VERSION,
    StoreFormat,
    StoreTooNew,
    check,
    contracted,
    expanded,
)
from gcs.store.ha import Change, LeaseInfo


def test_a_notice_round_trips_and_a_bad_one_is_ignored() -> None:
    notice = HandoverNotice("a", 3, "b")
    assert HandoverNotice.decode(notice.encode()) == notice
    assert HandoverNotice.decode(b"not json") is None
    assert HandoverNotice.decode(None) is None
    assert notice.for_member("b") and not notice.for_member("c")
    assert HandoverNotice("a", 3).for_member("c")


def test_a_standby_polls_the_lease_only_while_the_announcing_leader_holds_it() -> None:
    notice = HandoverNotice("a", 3, "")
    held = LeaseInfo("a", 3, 1500)
    assert standby_wait_s(notice, held, "b", 0.5) == POLL_S
    assert standby_wait_s(None, held, "b", 0.5) == 0.5  # no handover
    assert standby_wait_s(HandoverNotice("a", 3, "c"), held, "b", 0.5) == 0.5  # not for b
    assert standby_wait_s(notice, LeaseInfo("c", 4, 2000), "b", 0.5) == 0.5  # taken since
    assert standby_wait_s(notice, LeaseInfo("a", 2, 2000), "b", 0.5) == 0.5  # stale notice
    assert standby_wait_s(notice, None, "b", 0.3) == 0.3  # free: the caller tries at once


def test_the_mirror_sees_a_notice_in_the_stream_without_mirroring_its_table() -> None:
    mirror = TableMirror()
    notice = HandoverNotice("a", 7)
    mirror.apply([Change("GCS_HA", b"handover", notice.encode())])
    assert mirror.notice == notice and mirror.notices == 1
    assert "GCS_HA" not in mirror.tables


def test_expand_keeps_older_readers_and_contract_drops_them() -> None:
    legacy = StoreFormat.decode(None)
    assert legacy == StoreFormat(1, 1)
    grown = expanded(legacy)
    assert grown == StoreFormat(FORMAT_VERSION, 1)
    assert expanded(grown) is None  # a later leader of the same version: as is
    assert contracted(grown) == StoreFormat(FORMAT_VERSION, FORMAT_VERSION)
    assert contracted(StoreFormat(FORMAT_VERSION, FORMAT_VERSION)) is None
    # a newer store is never expanded "down", and still readable while it says so
    assert expanded(StoreFormat(FORMAT_VERSION + 1, 1)) is None
    check(StoreFormat(FORMAT_VERSION + 1, FORMAT_VERSION))


def test_a_member_cannot_read_a_store_that_needs_a_newer_one() -> None:
    with pytest.raises(StoreTooNew, match=f"this GCS knows format {FORMAT_VERSION}"):
        check(StoreFormat(FORMAT_VERSION + 1, FORMAT_VERSION + 1))
    with pytest.raises(StoreTooNew, match="not one this GCS"):
        StoreFormat.decode(b"{garbage")
    mirror = TableMirror()
    mirror.apply([Change(TABLE_META, FORMAT_KEY, StoreFormat(9, 9).encode())])
    with pytest.raises(StoreTooNew):
        check_mirror(mirror)
