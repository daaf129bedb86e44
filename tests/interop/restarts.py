"""What the tests that kill -9 and restart our GCS under a real Ray cluster share: a cluster
on a store key namespace of its own whose logs are kept for a failure's post-mortem, and
reads of our GCS's tables."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import time
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from gcs.proto import gcs_pb2, gcs_service_pb2
from tests.interop import venvs
from tests.interop.real_cluster import RealCluster, Worker, real_cluster

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
ALIVE, DEAD = gcs_pb2.ActorTableData.ALIVE, gcs_pb2.ActorTableData.DEAD


@contextlib.contextmanager
def restartable_cluster(
    ray_venv: venvs.Venv, storage: str, tmp_path: pathlib.Path, workers: list[Worker]
) -> Iterator[RealCluster]:
    """The cluster, on its own key namespace (a module's redis-server is shared); its logs
    are kept in ``tmp_path``."""
    namespace = ("--namespace", f"ft{time.monotonic_ns()}")
    with real_cluster(ray_venv, workers=workers, storage=storage, gcs_args=namespace) as c:
        try:
            yield c
        finally:
            for path in c.tmp.glob("*.log"):
                shutil.copy(path, tmp_path / path.name)
            for i, temp_dir in enumerate(c.temp_dirs):
                logs = temp_dir / "session_latest" / "logs"
                shutil.copytree(logs, tmp_path / f"node{i}", dirs_exist_ok=True)


def _get_all(cluster: RealCluster, service: str, method: str, request: Message) -> Any:
    """``method`` of our GCS's ``service`` (``GetAll...``), its reply decoded."""
    reply_type = getattr(gcs_service_pb2, f"{method}Reply")
    with grpc.insecure_channel(cluster.address) as channel:
        call = channel.unary_unary(
            f"/ray.rpc.{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply_type.FromString,
        )
        return call(request, timeout=30)


def node_table(cluster: RealCluster) -> list[gcs_pb2.GcsNodeInfo]:
    request = gcs_service_pb2.GetAllNodeInfoRequest()
    return list(_get_all(cluster, "NodeInfoGcsService", "GetAllNodeInfo", request).node_info_list)


def job_table(cluster: RealCluster) -> list[gcs_pb2.JobTableData]:
    request = gcs_service_pb2.GetAllJobInfoRequest()
    return list(_get_all(cluster, "JobInfoGcsService", "GetAllJobInfo", request).job_info_list)


def actor_table(cluster: RealCluster, class_name: str = "Counter") -> list[gcs_pb2.ActorTableData]:
    """Our actor table's ``class_name`` actors, dead jobs' too."""
    request = gcs_service_pb2.GetAllActorInfoRequest(show_dead_jobs=True)
    reply = _get_all(cluster, "ActorInfoGcsService", "GetAllActorInfo", request)
    return [a for a in reply.actor_table_data if a.class_name == class_name]
