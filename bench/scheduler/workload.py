"""The benchmark case of autoscaler-v2.md §6, scaled by a divisor (1 = big, 4 = quarter)."""

from __future__ import annotations

from typing import Any

NODE_TYPES: dict[str, dict[str, Any]] = {
    "head": {"resources": {"CPU": 0}, "min_workers": 0, "max_workers": 1},
    "cpu16": {"resources": {"CPU": 16, "memory": 64e9}, "min_workers": 0, "max_workers": 2000},
    "gpu8": {
        "resources": {"CPU": 32, "GPU": 8, "memory": 128e9},
        "min_workers": 0,
        "max_workers": 300,
    },
    "cpu64": {"resources": {"CPU": 64, "memory": 256e9}, "min_workers": 0, "max_workers": 200},
}


def scenario(div: int = 1) -> dict[str, Any]:
    """Scenario JSON (the reference schema) so Ray's harness can read the same input."""

    def n(x: int) -> int:
        return x // div

    nodes = [
        {"id": "head", "node_type": "head", "node_kind": "HEAD", "total": {"CPU": 0},
         "available": {"CPU": 0}, "ray_node_id": "h"},
        {"id": "busy", "node_type": "cpu16", "count": n(600), "total": {"CPU": 16, "memory": 64e9},
         "available": {"CPU": 0, "memory": 0}},
        {"id": "half", "node_type": "cpu16", "count": n(250), "total": {"CPU": 16, "memory": 64e9},
         "available": {"CPU": 8, "memory": 32e9}},
        {"id": "gpu", "node_type": "gpu8", "count": n(100),
         "total": {"CPU": 32, "GPU": 8, "memory": 128e9},
         "available": {"CPU": 16, "GPU": 4, "memory": 64e9}},
        {"id": "req", "node_type": "cpu16", "status": "REQUESTED", "count": n(50)},
    ]  # fmt: skip
    requests = [
        {"resources": {"CPU": 1}, "count": n(6000)},
        {"resources": {"CPU": 2, "memory": 4e9}, "count": n(2500)},
        {"resources": {"CPU": 4, "GPU": 1}, "count": n(1000)},
        {"resources": {"CPU": 8}, "count": n(450)},
        {"resources": {"CPU": 1, "custom": 1}, "count": n(50)},
    ]
    return {
        "node_types": NODE_TYPES,
        "max_num_nodes": 3001,
        "idle_timeout_s": 300,
        "existing_nodes": nodes,
        "resource_requests": requests,
    }
