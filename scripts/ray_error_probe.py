"""Probe the error path of GCS methods on a live GCS, Ray's or ours, with Ray's own stubs.

Run with the python of a ``ray==2.60.0`` venv (it imports ``ray.core.generated``):

    python scripts/ray_error_probe.py HOST:PORT [SKIP_METHOD,...] > answers.jsonl

One JSON line per request: the gRPC code, and the reply's ``GcsStatus`` (code, message) or
the details and binary error details (trailer ``grpc-status-details-bin``).  Running it
against Ray's gcs_server and ours side by side gave the table in ``docs/ray-answers.md``.
Ray's gcs_server aborts on UpdateWorkerDebuggerPort / UpdateWorkerNumPausedThreads of an
unknown worker (RAY_CHECK): skip them there and restart it.
"""

import json
import sys

import grpc
from ray.core.generated import autoscaler_pb2 as A
from ray.core.generated import autoscaler_pb2_grpc as AG
from ray.core.generated import gcs_service_pb2 as S
from ray.core.generated import gcs_service_pb2_grpc as G

addr = sys.argv[1]
ch = grpc.insecure_channel(addr)
stub = {
    "job": G.JobInfoGcsServiceStub(ch),
    "task": G.TaskInfoGcsServiceStub(ch),
    "actor": G.ActorInfoGcsServiceStub(ch),
    "node": G.NodeInfoGcsServiceStub(ch),
    "worker": G.WorkerInfoGcsServiceStub(ch),
    "pg": G.PlacementGroupInfoGcsServiceStub(ch),
    "kv": G.InternalKVGcsServiceStub(ch),
    "as": AG.AutoscalerStateServiceStub(ch),
    "env": G.RuntimeEnvGcsServiceStub(ch),
    "res": G.NodeResourceInfoGcsServiceStub(ch),
    "pub": G.InternalPubSubGcsServiceStub(ch)
    if hasattr(G, "InternalPubSubGcsServiceStub")
    else G.ControlPlanePubSubGcsServiceStub(ch),
}
N = b"\x07" * 28
CASES = [
    ("job", "GetAllJobInfo", S.GetAllJobInfoRequest(limit=-1)),
    ("job", "MarkJobFinished", S.MarkJobFinishedRequest(job_id=b"\x09\x00\x00\x00")),
    ("task", "GetTaskEvents", S.GetTaskEventsRequest(limit=-1)),
    (
        "task",
        "GetTaskEvents",
        S.GetTaskEventsRequest(
            filters=S.GetTaskEventsRequest.Filters(
                job_filters=[
                    S.GetTaskEventsRequest.Filters.JobIdFilter(
                        predicate=5, job_id=b"\x01\x00\x00\x00"
                    )
                ]
            )
        ),
    ),
    (
        "task",
        "GetTaskEvents",
        S.GetTaskEventsRequest(
            filters=S.GetTaskEventsRequest.Filters(
                state_filters=[
                    S.GetTaskEventsRequest.Filters.StateFilter(predicate=7, state="RUNNING")
                ]
            )
        ),
    ),
    ("actor", "GetAllActorInfo", S.GetAllActorInfoRequest(limit=-1)),
    ("actor", "GetActorInfo", S.GetActorInfoRequest(actor_id=b"\x01" * 16)),
    ("actor", "GetNamedActorInfo", S.GetNamedActorInfoRequest(name="nope", ray_namespace="ns")),
    ("actor", "KillActorViaGcs", S.KillActorViaGcsRequest(actor_id=b"\x01" * 16)),
    ("actor", "ReportActorOutOfScope", S.ReportActorOutOfScopeRequest(actor_id=b"\x01" * 16)),
    (
        "actor",
        "RestartActorForLineageReconstruction",
        S.RestartActorForLineageReconstructionRequest(
            actor_id=b"\x01" * 16, num_restarts_due_to_lineage_reconstruction=1
        ),
    ),
    ("node", "GetAllNodeInfo", S.GetAllNodeInfoRequest(limit=-1)),
    ("node", "GetAllNodeAddressAndLiveness", S.GetAllNodeAddressAndLivenessRequest(limit=-1)),
    ("node", "DrainNode", S.DrainNodeRequest(drain_node_data=[S.DrainNodeData(node_id=N)])),
    ("node", "CheckAlive", S.CheckAliveRequest(node_ids=[N])),
    ("worker", "GetAllWorkerInfo", S.GetAllWorkerInfoRequest(limit=-1)),
    ("worker", "GetWorkerInfo", S.GetWorkerInfoRequest(worker_id=N)),
    (
        "worker",
        "UpdateWorkerDebuggerPort",
        S.UpdateWorkerDebuggerPortRequest(worker_id=N, debugger_port=1234),
    ),
    (
        "worker",
        "UpdateWorkerNumPausedThreads",
        S.UpdateWorkerNumPausedThreadsRequest(worker_id=N, num_paused_threads_delta=1),
    ),
    ("pg", "GetAllPlacementGroup", S.GetAllPlacementGroupRequest(limit=-1)),
    ("pg", "GetPlacementGroup", S.GetPlacementGroupRequest(placement_group_id=b"\x02" * 18)),
    ("pg", "GetNamedPlacementGroup", S.GetNamedPlacementGroupRequest(name="nope")),
    ("pg", "RemovePlacementGroup", S.RemovePlacementGroupRequest(placement_group_id=b"\x02" * 18)),
    (
        "pg",
        "WaitPlacementGroupUntilReady",
        S.WaitPlacementGroupUntilReadyRequest(placement_group_id=b"\x02" * 18),
    ),
    ("kv", "InternalKVGet", S.InternalKVGetRequest(key=b"nope", namespace=b"x")),
    ("kv", "InternalKVMultiGet", S.InternalKVMultiGetRequest(keys=[b"nope"], namespace=b"x")),
    ("kv", "InternalKVDel", S.InternalKVDelRequest(key=b"nope", namespace=b"x")),
    ("kv", "InternalKVExists", S.InternalKVExistsRequest(key=b"nope", namespace=b"x")),
    ("kv", "InternalKVKeys", S.InternalKVKeysRequest(prefix=b"nope", namespace=b"x")),
    ("env", "PinRuntimeEnvURI", S.PinRuntimeEnvURIRequest(uri="gcs://x.zip", expiration_s=-1)),
    ("res", "GetDrainingNodes", S.GetDrainingNodesRequest()),
    ("as", "DrainNode", A.DrainNodeRequest(node_id=N, reason=1, deadline_timestamp_ms=-1)),
    ("as", "DrainNode", A.DrainNodeRequest(node_id=N, reason=1, deadline_timestamp_ms=0)),
    (
        "as",
        "ResizeRayletResourceInstances",
        A.ResizeRayletResourceInstancesRequest(node_id=N, resources={"CPU": 1}),
    ),
    ("pub", "GcsSubscriberPoll", S.GcsSubscriberPollRequest(subscriber_id=b"\x03" * 28)),
    (
        "pub",
        "GcsSubscriberCommandBatch",
        S.GcsSubscriberCommandBatchRequest(subscriber_id=b"\x03" * 28, commands=[]),
    ),
]
out = []
SKIP = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set()
for svc, method, req in CASES:
    if method in SKIP:
        continue
    row = {"method": f"{svc}.{method}", "req": str(req).replace("\n", " ")[:90]}
    try:
        reply, call = getattr(stub[svc], method).with_call(req, timeout=5)
        row["grpc"] = "OK"
        st = getattr(reply, "status", None)
        if st is not None and reply.HasField("status"):
            row["status"] = [st.code, st.message]
        row["reply"] = str(reply).replace("\n", " ")[:160]
    except grpc.RpcError as e:
        row["grpc"] = e.code().name
        row["details"] = e.details()
        row["trailers"] = [
            (k, v.decode() if isinstance(v, bytes) else v)
            for k, v in (e.trailing_metadata() or ())
            if k.startswith("grpc-status-details")
        ]
    out.append(row)
    print(json.dumps(row), flush=True)
