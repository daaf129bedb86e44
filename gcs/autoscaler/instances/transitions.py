"""The instance lifecycle as data: which status may follow which (Ray 2.60's table).

Every edge names the observation that causes it.  Questions such as "can this instance
still reach RAY_RUNNING?" are answered from the table (:func:`reachable_from`), never by
listing statuses by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from gcs.policy.autoscaling.model import InstanceStatus as S

VALID_TRANSITIONS: Mapping[S, frozenset[S]] = {
    S.QUEUED: frozenset(
        {
            S.REQUESTED,  # the reconciler asked the provider to launch it
            S.TERMINATED,  # cancelled before any launch request (scale-down, max workers)
        }
    ),
    S.REQUESTED: frozenset(
        {
            S.ALLOCATED,  # a cloud instance of its type appeared for it
            S.QUEUED,  # the launch timed out and is retried with the same request id
            S.ALLOCATION_FAILED,  # the provider reported a launch error, or retries ran out
        }
    ),
    S.ALLOCATED: frozenset(
        {
            S.RAY_INSTALLING,  # the node updater started installing Ray
            S.RAY_RUNNING,  # a raylet on it registered with the GCS
            S.ALLOCATION_TIMEOUT,  # no raylet within the allocate timeout
            S.RAY_STOPPING,  # its raylet is draining
            S.RAY_STOPPED,  # its raylet is dead
            S.TERMINATING,  # terminated before Ray ran (max workers, idle pending node)
            S.TERMINATED,  # the cloud instance disappeared
        }
    ),
    S.RAY_INSTALLING: frozenset(
        {
            S.RAY_RUNNING,  # the raylet registered
            S.RAY_INSTALL_FAILED,  # the installer gave up, or the install timed out
            S.RAY_STOPPED,  # the raylet died while installing
            S.TERMINATING,  # terminated while installing (max workers)
            S.TERMINATED,  # the cloud instance disappeared
        }
    ),
    S.RAY_RUNNING: frozenset(
        {
            S.RAY_STOP_REQUESTED,  # the scheduler chose it for termination
            S.RAY_STOPPING,  # its raylet is draining
            S.RAY_STOPPED,  # its raylet is dead or missing from the GCS
            S.TERMINATING,  # terminated directly
            S.TERMINATED,  # the cloud instance disappeared
        }
    ),
    S.RAY_STOP_REQUESTED: frozenset(
        {
            S.RAY_STOPPING,  # the drain was accepted
            S.RAY_STOPPED,  # the raylet died
            S.RAY_RUNNING,  # the drain was rejected (busy) or timed out
            S.TERMINATED,  # the cloud instance disappeared
        }
    ),
    S.ALLOCATION_TIMEOUT: frozenset({S.TERMINATING, S.TERMINATED}),
    S.RAY_STOPPING: frozenset({S.RAY_STOPPED, S.TERMINATING, S.TERMINATED}),
    S.RAY_STOPPED: frozenset({S.TERMINATING, S.TERMINATED}),
    S.TERMINATING: frozenset(
        {
            S.TERMINATED,  # the cloud instance is gone
            S.TERMINATION_FAILED,  # the provider reported a terminate error, or timed out
        }
    ),
    S.TERMINATION_FAILED: frozenset({S.TERMINATING, S.TERMINATED}),
    S.RAY_INSTALL_FAILED: frozenset({S.TERMINATING, S.TERMINATED}),
    S.TERMINATED: frozenset(),
    S.ALLOCATION_FAILED: frozenset(),
    S.UNKNOWN: frozenset(),
}

UPSERT_STATUSES: frozenset[S] = frozenset({S.QUEUED, S.ALLOCATED, S.TERMINATING})
"""The only statuses a new instance may be created in."""

TERMINAL_STATUSES: frozenset[S] = frozenset(s for s, nxt in VALID_TRANSITIONS.items() if not nxt)


def is_valid_transition(old: S, new: S) -> bool:
    return new in VALID_TRANSITIONS[old]


@cache
def reachable_from(status: S) -> frozenset[S]:
    """Every status reachable in one or more steps (a status is in its own set only when
    a cycle returns to it)."""
    seen: set[S] = set()
    stack = list(VALID_TRANSITIONS[status])
    while stack:
        nxt = stack.pop()
        if nxt in seen:
            continue
        seen.add(nxt)
        stack.extend(VALID_TRANSITIONS[nxt])
    return frozenset(seen)


_RAY_RUNNING_REACHABLE = frozenset(
    s for s in S if s == S.RAY_RUNNING or S.RAY_RUNNING in reachable_from(s)
)


def is_ray_running_reachable(status: S) -> bool:
    return status in _RAY_RUNNING_REACHABLE


RAY_RUNNING_STATUSES: frozenset[S] = frozenset(
    (reachable_from(S.RAY_RUNNING) | {S.RAY_RUNNING})
    - (reachable_from(S.RAY_STOPPING) | {S.RAY_STOPPING})
)
"""Ray is (still) running on the instance: RAY_RUNNING and RAY_STOP_REQUESTED."""

CLOUD_ALLOCATED_STATUSES: frozenset[S] = frozenset(
    {
        S.ALLOCATED,
        S.RAY_INSTALLING,
        S.RAY_RUNNING,
        S.RAY_STOPPING,
        S.RAY_STOP_REQUESTED,
        S.RAY_STOPPED,
        S.TERMINATING,
        S.RAY_INSTALL_FAILED,
        S.TERMINATION_FAILED,
        S.ALLOCATION_TIMEOUT,
    }
)
"""A cloud instance exists (or may still exist) for the instance."""
