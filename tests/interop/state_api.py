"""Ray's state API over HTTP, for waiting on what ``ray list`` will show.

``ray list tasks --filter name=x --detail`` is a Python process that imports Ray and makes one
``GET /api/v0/tasks?...`` to the dashboard (``ray.util.state.api.StateApiClient.list``):
~1.5 CPU s a call, most of it the import.  A wait that polled the CLI started one every
0.2 s until its condition held.  :func:`list_state` makes the same request from the test's
process, so a test waits on it and then checks with the CLI once, what a user would run.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

TIMEOUT_S = 60.0
"""Bounds a hang only (a loaded machine's dashboard answers slowly)."""


def list_state(
    dashboard: str, what: str, *filters: tuple[str, str], detail: bool = False
) -> list[dict[str, Any]]:
    """The rows ``ray list <what> --limit 1000 [--filter k=v ...] [--detail]`` prints (its
    defaults: the driver's own task excluded, the server's timeout 24 s), from the
    dashboard at ``dashboard`` (``http://host:port``)."""
    query = [("limit", "1000"), ("timeout", "24"), ("detail", str(detail).lower())]
    query.append(("exclude_driver", "true"))
    for key, value in filters:
        query += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
    url = f"{dashboard}/api/v0/{what}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
        body = json.loads(reply.read())
    if body.get("result") is False:
        raise AssertionError(f"GET {url}: {body.get('msg')}")
    rows: list[dict[str, Any]] = body["data"]["result"]["result"]
    return rows
