"""The facts a user reads on Ray's dashboard pages, made comparable across two clusters.

Each ``*_facts`` function takes a :class:`~tests.interop.dashboard_browser.Page` and keeps
what a page says about the cluster (node count and states, which node is the head, logical
resources, job and actor rows, the autoscaler's node and resource report, events) with what
differs between any two clusters by nature made neutral: ids, addresses, pids, times and
durations, and the byte figures the machine's free memory decides.  The ``*_ready``
predicates say when a page shows the whole workload of the test (the dashboard fills its
tables from APIs it polls), so that both clusters are read at the same point.
"""

from __future__ import annotations

import re
from typing import Any

from tests.interop.dashboard_browser import Page

OUR_LABELS = "gcs.ray.io/"
"""Label keys our GCS adds to the nodes it starts itself (the head raylet): not Ray's."""

TIMED_SOURCES = ("AUTOSCALER",)
"""Event sources left out: stock's autoscaler (v2, no node types) logs "No available node
types can fulfill resource requests {'CPU': 1.0}*1" only when one of its 5 s loops sees a task
queued behind the 3 CPUs; a race, not a fact of the cluster."""
_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{16,}(?![0-9a-f])")
_ADDRESS = re.compile(r"\b127\.0\.0\.\d+(:\d+)?\b")
_BYTES = re.compile(r"\b\d+(\.\d+)?\s?(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b")
_COUNTER = re.compile(r"^([A-Z_]+)\s*\nx (\d+)$", re.MULTILINE)
_EXPAND = re.compile(r"\s*\nExpand$")
_EXIT_ACTOR = re.compile(
    r"Worker exits by an user request\. Worker exits with an exit code 0\. exit_actor\(\) is "
    r"called\.|User requested to exit the actor\."
)
"""The two details an actor's worker reports after ``exit_actor()``: which one is decided
inside the worker (its task returns first, or its 10 ms exit check runs first; Ray's own
tests accept both), not by the GCS."""


def neutral(text: str, head_host: str = "") -> str:
    """``text`` with ids, addresses and byte sizes replaced (the head's address by
    ``<head>``, any other by ``<ip>``); whitespace runs made one space."""
    text = _EXPAND.sub("", text)
    text = _ID.sub("<id>", text)
    if head_host:
        text = re.sub(rf"\b{re.escape(head_host)}(:\d+)?\b", "<head>", text)
    text = _ADDRESS.sub("<ip>", text)
    text = _BYTES.sub("<bytes>", text)
    return " ".join(text.split())


def _between(text: str, start: str, end: str) -> list[str]:
    """The lines of ``text`` after the line ``start`` and before the line ``end``."""
    lines = text.splitlines()
    try:
        first = lines.index(start) + 1
        last = lines.index(end, first)
    except ValueError:
        return []
    return [line.strip() for line in lines[first:last] if line.strip()]


def counters(page: Page) -> dict[str, int]:
    """The state chips over a list (``TOTAL x 3``, ``ALIVE x 1``...)."""
    return {state: int(n) for state, n in _COUNTER.findall(page.text)}


def overview_facts(page: Page, head_host: str) -> dict[str, Any]:
    """Recent jobs (title and entrypoint), the autoscaler's node and resource reports and
    the events' messages."""
    text = page.text
    events = [m for source, m in _events(text) if source not in TIMED_SOURCES]
    jobs = _between(text, "Recent jobs", "View all jobs")
    return {
        "recent_jobs": [neutral(s, head_host) for s in jobs],
        "node_status": [neutral(s) for s in _between(text, "Node Status", "Resource Status")],
        "resource_status": [neutral(s) for s in _between(text, "Resource Status", "Events")],
        "events": sorted(neutral(m) for m in events),
    }  # fmt: skip


def _events(text: str) -> list[tuple[str, str]]:
    """The event table's (source, message) pairs: each event's fields end with its
    ``eventId``, the message on the next line."""
    out, source, lines = [], "", text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("source: "):
            source = line.removeprefix("source: ").strip()
        elif line.startswith("eventId: "):
            out.append((source, lines[i + 1].strip()))
    return out


def overview_ready(facts: dict[str, Any], nodes: int, jobs: int) -> bool:
    node_lines = [s for s in facts["node_status"] if s.startswith("1 node_")]
    return (
        len(node_lines) == nodes
        and len(facts["recent_jobs"]) >= 2 * jobs  # each: its title, its entrypoint
        and len(facts["events"]) >= 2  # the job API's submitted job: started, completed
        and any("CPU" in s for s in facts["resource_status"])
    )


def _labels(cell: str) -> list[str]:
    """Label keys and values (``key: value`` pairs), ours left out."""
    pairs = re.findall(r"(\S+): (\S+)", _EXPAND.sub("", cell))
    return sorted(f"{k}: {neutral(v)}" for k, v in pairs if not k.startswith(OUR_LABELS))


def cluster_facts(page: Page, head_host: str) -> dict[str, Any]:
    """The node table: per node its state, state message, whether it is the head, its
    logical resources and labels; and the state chips."""
    rows = [
        {
            "host": row.get("Host / Worker Process name", ""),
            "state": row.get("State", ""),
            "state_message": neutral(row.get("State Message", "")),
            "head": "(Head)" in row.get("IP / PID", ""),
            "at_head_address": row.get("IP / PID", "").split(" ")[0] == head_host,
            "logical_resources": neutral(row.get("Logical Resources", "")),
            "labels": _labels(row.get("Labels", "")),
        }
        for row in page.table("Logical Resources")
    ]
    return {"nodes": sorted(rows, key=repr), "counters": counters(page)}


def cluster_ready(facts: dict[str, Any], nodes: int) -> bool:
    rows = facts["nodes"]
    return len(rows) == nodes and all("CPU" in r["logical_resources"] for r in rows)


def _present(cell: str) -> str:
    """``-`` stays ``-``; a value (a pid, a worker id) becomes ``<set>``."""
    return "-" if cell.strip() in ("", "-") else "<set>"


def jobs_facts(page: Page, head_host: str) -> dict[str, Any]:
    """The job table: id, name, submission id, entrypoint, status, status message, whether
    a driver pid is shown."""
    rows = [
        {
            "job_id": row.get("Job ID", ""),
            "name": row.get("Name", ""),
            "submission_id": row.get("Submission ID", ""),
            "entrypoint": neutral(row.get("Entrypoint", ""), head_host),
            "status": row.get("Status", ""),
            "status_message": neutral(row.get("Status message", ""), head_host),
            "driver_pid": _present(row.get("Driver Pid", "")),
        }
        for row in page.table("Entrypoint")
    ]
    return {"jobs": sorted(rows, key=repr)}


def jobs_ready(facts: dict[str, Any], jobs: int) -> bool:
    rows = facts["jobs"]
    return len(rows) == jobs and all(
        r["status"] in ("SUCCEEDED", "FAILED", "STOPPED") for r in rows
    )


def actors_facts(page: Page, head_host: str) -> dict[str, Any]:
    """The actor table: class, name, repr, state, job, worker and pid shown or not,
    restarts, placement group, required resources, label selector, exit detail; and the
    state chips.  (Not the node an actor runs on: the raylets choose it.)"""
    rows = [
        {
            "class": row.get("Class", ""),
            "name": row.get("Name", ""),
            "repr": row.get("Repr", ""),
            "state": row.get("State", ""),
            "job_id": row.get("Job ID", ""),
            "worker_id": _present(row.get("Worker ID", "")),
            "pid": _present(row.get("PID", "")),
            "restarted": row.get("Restarted", ""),
            "placement_group": row.get("Placement group ID", ""),
            "required_resources": neutral(row.get("Required resources", "")),
            "label_selector": neutral(row.get("Label selector", "")),
            "exit_detail": neutral(
                _EXIT_ACTOR.sub("<exit_actor()>", row.get("Exit detail", "")), head_host
            ),
        }
        for row in page.table("Exit detail")
    ]
    return {"actors": sorted(rows, key=repr), "counters": counters(page)}


def actors_ready(facts: dict[str, Any], actors: int) -> bool:
    return len(facts["actors"]) == actors
