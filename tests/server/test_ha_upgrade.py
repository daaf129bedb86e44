"""Rolling upgrades of a ``gcs serve --ha`` group (issue 29): the store's format record
(``gcs.store.format``) expanded by a new leader, contracted by ``gcs ha finish-upgrade``, and
a member that cannot read the store refusing to join -- or leaving once it can no longer
read it -- with one line on stderr and exit code 1.  Real processes on a private Redis."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gcs.store.factory import open_store
from gcs.store.format import FORMAT_VERSION, StoreFormat, read_format, write_format
from gcs.testing.ha_group import HaGroup
from gcs.testing.ports import free_port
from gcs.testing.redis_server import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture
def group(redis_server: RedisServer, tmp_path: pathlib.Path) -> Iterator[HaGroup]:
    group = HaGroup(redis_server.url, free_port(), tmp_path)
    yield group
    group.stop()


async def _format(group: HaGroup) -> StoreFormat:
    store = await open_store(group.storage, namespace=group.namespace, ha=True)
    try:
        return (await read_format(store))[0]
    finally:
        await store.close()


async def _set_format(group: HaGroup, new: StoreFormat) -> None:
    store = await open_store(group.storage, namespace=group.namespace, ha=True)
    try:
        _, raw = await read_format(store)
        await write_format(store, new, raw)
    finally:
        await store.close()


def _stderr_lines(path: pathlib.Path) -> list[str]:
    """The member's output lines that are not JSON log records (what a person reads)."""
    return [
        line
        for line in path.read_text(errors="replace").splitlines()
        if line.strip() and not line.startswith("{")
    ]


def _finish_upgrade(group: HaGroup) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gcs", "ha", "finish-upgrade", "--format", "json",
         "--storage", group.storage, "--namespace", group.namespace],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_a_new_leader_expands_the_format_and_finish_upgrade_contracts_it(
    group: HaGroup,
) -> None:
    assert await _format(group) == StoreFormat(1, 1)  # an empty store: format 1
    a = group.add("a")
    a.wait_for("ha.format_expanded")
    a.wait_for("ha.leader")
    # expand: the older format's members still read the store
    assert await _format(group) == StoreFormat(FORMAT_VERSION, 1)
    done = await asyncio.to_thread(_finish_upgrade, group)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"version": FORMAT_VERSION, "min_reader": FORMAT_VERSION}
    assert await _format(group) == StoreFormat(FORMAT_VERSION, FORMAT_VERSION)
    # a later leader (a takeover) leaves a contracted format as it is
    b = group.add("b")
    b.wait_for("ha.standby")
    a.stop()
    b.wait_for("ha.leader")
    assert await _format(group) == StoreFormat(FORMAT_VERSION, FORMAT_VERSION)
    assert b.count("ha.format_expanded") == 0


async def test_a_member_refuses_to_join_a_store_in_a_newer_format(group: HaGroup) -> None:
    await _set_format(group, StoreFormat(FORMAT_VERSION + 1, FORMAT_VERSION + 1))
    a = group.add("a")
    assert a.proc is not None
    assert await asyncio.to_thread(a.proc.wait, 60) == 1
    lines = _stderr_lines(a.log_path)
    assert len(lines) == 1, lines
    assert f"this GCS knows format {FORMAT_VERSION}" in lines[0], lines
    assert "Traceback" not in a.log_path.read_text()
    assert a.count("ha.leader") == 0


async def test_a_standby_leaves_once_the_store_needs_a_newer_member(group: HaGroup) -> None:
    a = group.add("a")
    a.wait_for("ha.leader")
    b = group.add("b")
    b.wait_for("ha.standby")
    # a newer version's finish-upgrade, as seen by this one: min_reader past it
    await _set_format(group, StoreFormat(FORMAT_VERSION + 1, FORMAT_VERSION + 1))
    assert b.proc is not None
    assert await asyncio.to_thread(b.proc.wait, 60) == 1
    lines = _stderr_lines(b.log_path)
    assert len(lines) == 1 and "upgrade it" in lines[0], lines


def test_finish_upgrade_refuses_a_bad_storage_url_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gcs", "ha", "finish-upgrade", "--storage", "nope://x"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "--storage" in done.stderr
