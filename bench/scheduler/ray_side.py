"""Run inside a ray==2.60.0 virtualenv: time Ray's ResourceDemandScheduler on a scenario.

Reads the scenario JSON (autoscaler-v2.md §6 schema, subset used by the benchmark) on stdin,
prints {"seconds": s, "launch": {type: n}} as the last stdout line.
"""

import json
import sys
import time

from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest
from ray.autoscaler.v2.schema import AutoscalerInstance
from ray.core.generated.autoscaler_pb2 import NodeState, ResourceRequest, ResourceRequestByCount
from ray.core.generated.instance_manager_pb2 import Instance, NodeKind


def main() -> None:
    sc = json.load(sys.stdin)
    types = {
        name: NodeTypeConfig(
            name=name, min_worker_nodes=t.get("min_workers", 0),
            max_worker_nodes=t.get("max_workers", 0), resources=t["resources"],
        )
        for name, t in sc["node_types"].items()
    }  # fmt: skip
    instances = []
    for raw in sc["existing_nodes"]:
        ids = (
            [raw["id"]] if "count" not in raw else [f"{raw['id']}-{i}" for i in range(raw["count"])]
        )
        for iid in ids:
            status = getattr(Instance, raw.get("status", "RAY_RUNNING"))
            kind = NodeKind.HEAD if raw.get("node_kind") == "HEAD" else NodeKind.WORKER
            im = Instance(
                instance_id=iid, instance_type=raw["node_type"], status=status, node_kind=kind
            )
            ray_node = None
            if status == Instance.RAY_RUNNING:
                nid = raw.get("ray_node_id", f"r-{iid}")
                im.node_id = nid
                ray_node = NodeState(
                    node_id=nid.encode(), ray_node_type_name=raw["node_type"],
                    total_resources=raw["total"], available_resources=raw["available"],
                )  # fmt: skip
            instances.append(
                AutoscalerInstance(im_instance=im, ray_node=ray_node, cloud_instance_id=iid)
            )
    requests = [
        ResourceRequestByCount(
            request=ResourceRequest(resources_bundle=r["resources"]), count=r["count"]
        )
        for r in sc["resource_requests"]
    ]
    req = SchedulingRequest(
        disable_launch_config_check=True, node_type_configs=types,
        max_num_nodes=sc.get("max_num_nodes"), idle_timeout_s=sc.get("idle_timeout_s"),
        resource_requests=requests, current_instances=instances,
    )  # fmt: skip
    t0 = time.perf_counter()
    reply = ResourceDemandScheduler().schedule(req)
    secs = time.perf_counter() - t0
    launch = {}
    for lr in reply.to_launch:
        launch[lr.instance_type] = launch.get(lr.instance_type, 0) + lr.count
    print(json.dumps({"seconds": secs, "launch": launch}))


if __name__ == "__main__":
    main()
