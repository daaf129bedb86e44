"""The dashboard page facts (tests/interop/dashboard_facts.py) on page text as Chromium reads
it: what differs by nature is made neutral, what a user reads is kept, so the page test
(tests/interop/test_dashboard.py) fails on a real difference and only on one."""

from __future__ import annotations

from tests.interop import dashboard_facts as facts
from tests.interop.dashboard_browser import Page

NODE = "a4b188a5b8b320050ac82d09b3cc3bdc8fee04e70fadcf00947d09b9"
OVERVIEW = f"""Recent jobs

pages-job

python -c 'print(1)'
View all jobs
Node Status
Active:
1 node_{NODE}
Pending:
(no pending nodes)
Resource Status
Total Usage:
0.0/3.0 CPU
0B/31.51GiB memory
Events
INFO
2026-11-29 05:09:52
CustomFields
severity: INFO
source: JOBS
eventId: adBe4dA15BC3cbBA7cF3Efb3Ac37A2729F83
Completed a ray job pages-job with a status SUCCEEDED.
WARNING
CustomFields
source: AUTOSCALER
eventId: 6cDa6ca8
No available node types can fulfill resource requests {{'CPU': 1.0}}*1.
1
"""


def test_neutral_replaces_ids_addresses_and_sizes_and_keeps_words() -> None:
    text = f"Owner Id: {NODE} Owner Ip address: 127.0.0.4 at 127.0.0.5:6379 0B/15.76GiB memory"
    assert facts.neutral(text, "127.0.0.4") == (
        "Owner Id: <id> Owner Ip address: <head> at <ip> <bytes>/<bytes> memory"
    )
    assert facts.neutral("Shutdown by ray.shutdown().") == "Shutdown by ray.shutdown()."


def test_overview_keeps_the_reports_and_the_jobs_events_not_the_autoscalers() -> None:
    seen = facts.overview_facts(Page(text=OVERVIEW, tables=[]), "127.0.0.4")
    assert seen["recent_jobs"] == ["pages-job", "python -c 'print(1)'"]
    assert seen["node_status"] == ["Active:", "1 node_<id>", "Pending:", "(no pending nodes)"]
    assert seen["resource_status"] == ["Total Usage:", "0.0/3.0 CPU", "<bytes>/<bytes> memory"]
    assert seen["events"] == ["Completed a ray job pages-job with a status SUCCEEDED."]
    assert not facts.overview_ready(seen, nodes=2, jobs=1)


def test_a_node_row_keeps_state_head_resources_and_rays_labels() -> None:
    headers = ["State", "IP / PID", "Logical Resources", "Labels"]
    row = [
        "ALIVE",
        "127.0.0.2 (Head)",
        "0.0/1.0 CPU 0B/15.76GiB memory\nExpand",
        f"gcs.ray.io/head-raylet: 'true' ray.io/node-id: {NODE}\nExpand",
    ]
    page = Page(text="TOTAL\nx 2\nALIVE\nx 2", tables=[{"headers": headers, "rows": [row]}])
    seen = facts.cluster_facts(page, "127.0.0.2")
    [node] = seen["nodes"]
    assert node["head"] and node["at_head_address"] and node["state"] == "ALIVE"
    assert node["logical_resources"] == "0.0/1.0 CPU <bytes>/<bytes> memory"
    assert node["labels"] == ["ray.io/node-id: <id>"]
    assert seen["counters"] == {"TOTAL": 2, "ALIVE": 2}


def test_an_actors_exit_detail_is_kept_but_exit_actors_two_wordings_are_one() -> None:
    headers = ["Class", "State", "PID", "Exit detail"]
    wordings = [
        "Worker exits by an user request. Worker exits with an exit code 0. "
        "exit_actor() is called.",
        "User requested to exit the actor.",
    ]
    details = [
        facts.actors_facts(
            Page(text="", tables=[{"headers": headers, "rows": [["A", "DEAD", "12", w]]}]), ""
        )["actors"][0]["exit_detail"]
        for w in wordings
    ]
    assert details[0] == details[1]
    crashed = "Worker exit detail: Owner's worker process has crashed."
    shutdown = "Worker exit detail: Shutdown by ray.shutdown()."
    rows = [[["A", "DEAD", "-", crashed]], [["A", "DEAD", "-", shutdown]]]
    first, second = (
        facts.actors_facts(Page(text="", tables=[{"headers": headers, "rows": r}]), "")
        for r in rows
    )
    assert first != second
