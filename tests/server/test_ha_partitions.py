"""The partition suite, small (issue 29): two ``gcs serve --ha`` members, each behind its own
TCP proxy to a private Redis, one blackhole round on the leader's link with clients on the
shared address (KV linearizability, monotonic job states).  The large run is
``python -m bench.ha.partitions``.  Real processes and real time (~15 s)."""

from __future__ import annotations

import argparse

import pytest

from bench.ha.partitions import met, suite
from gcs.testing.monotonic import MonotonicCheck

pytestmark = pytest.mark.timeout(180)


async def test_a_blackholed_leader_loses_nothing_strands_nothing_and_is_replaced_in_time() -> None:
    args = argparse.Namespace(
        scenarios=["blackhole"],
        rounds=1,
        members=["a", "b"],
        ttl_ms=2000,
        renew_ms=500,
        warm_s=1.0,
        fault_s=3.5,
        after_s=2.0,
    )
    tallies, _ = await suite(args)
    tally = tallies["blackhole"]
    assert tally.operations > 100
    assert met(tally, args.ttl_ms), tally


def test_the_monotonic_check_has_teeth() -> None:
    states = MonotonicCheck()
    states.acked("job", b"j", 1, 0.0, 1.0)
    states.read("job", b"j", 1, 1.5, 2.0)
    states.acked("job", b"j", 2, 2.0, 3.0)
    states.read("job", b"j", 1, 2.5, 3.5)  # overlaps the finish: either is fine
    assert states.violations() == []
    states.read("job", b"j", 1, 4.0, 4.5)  # after the finish was acknowledged: went back
    states.read("job", b"j", 0, 5.0, 5.5)  # a known job missing
    assert len(states.violations()) == 2
