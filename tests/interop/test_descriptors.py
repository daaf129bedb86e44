"""Our protos are wire-identical to Ray 2.60's (and ant-ray 2.44's where Ray has nothing).

The Ray side is read inside the real wheels' virtualenvs (``ray.core.generated.*_pb2``), ours
in this process (``gcs.proto.*_pb2``); both are described by ``descriptor_dump`` and compared
by ``wire_diff``.  Deliberate additions are listed in ``ALLOWED`` below, exactly.
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

import gcs.proto
from tests.interop import descriptor_dump, venvs
from tests.interop.embedded_descriptor import syncer_descriptor_from_wheel
from tests.interop.wire_diff import (
    AllowList,
    allow_list_problems,
    ant_ray_field_mismatches,
    compare,
    renamed,
)

RAY_MODULES = [
    f"ray.core.generated.{name}_pb2"
    for name in (
        "autoscaler",
        "common",
        "core_worker",
        "gcs",
        "gcs_service",
        "node_manager",
        "pubsub",
        "runtime_environment",
        "logging",
        "profile_events",
    )
]

_OURS = "gcs's own extensions, numbered from 100 so that Ray's and ant-ray's stay free"
_NEWER_ANT_RAY = "ant-ray after 2.44.1.1 (virtual-cluster autoscaling config, node removal)"
ALLOWED = AllowList(
    fields={
        # ant-ray 2.44.1.1 fields on Ray 2.60 messages (ant-ray's numbers, checked below).
        ("ray.rpc.PubMessage", "virtual_cluster_message"): 20,
        ("ray.rpc.GetAllAvailableResourcesRequest", "virtual_cluster_id"): 1,
        ("ray.rpc.GetAllTotalResourcesRequest", "virtual_cluster_id"): 1,
        ("ray.rpc.GetAllNodeInfoRequest", "filters"): 4,
        ("ray.rpc.JobTableData", "virtual_cluster_id"): 13,
        ("ray.rpc.SchedulingStrategy", "virtual_cluster_id"): 11,
        # _NEWER_ANT_RAY: not in any wheel we can check against.
        ("ray.rpc.VirtualClusterTableData", "min_replica_sets"): 6,
        ("ray.rpc.VirtualClusterTableData", "max_replica_sets"): 7,
        ("ray.rpc.VirtualClusterTableData", "max_nodes"): 8,
        ("ray.rpc.autoscaler.ClusterResourceState", "virtual_cluster_states"): 8,
        # _OURS: gcs extensions at numbers from 100 up, which no Ray or ant-ray peer sends or
        # reads (an old client leaves them unset and gets ant-ray's behaviour).
        ("ray.rpc.CreateOrUpdateVirtualClusterRequest", "autoscaler_move"): 100,
        ("ray.rpc.VirtualClusterTableData", "declared_replica_sets"): 100,
        ("ray.rpc.ResourceDemand", "job_id"): 100,
        ("ray.rpc.CreateOrUpdateVirtualClusterRequest", "must_exist"): 101,
    },
    enum_values={("ray.rpc.ChannelType", "RAY_VIRTUAL_CLUSTER_CHANNEL"): 11},
    messages=frozenset(
        {  # _NEWER_ANT_RAY
            "ray.rpc.GetAutoscalingConfigReply",
            "ray.rpc.GetAutoscalingConfigReply.MaxReplicaSetsEntry",
            "ray.rpc.GetAutoscalingConfigReply.MinReplicaSetsEntry",
            "ray.rpc.GetAutoscalingConfigRequest",
            "ray.rpc.RemoveNodesFromVirtualClusterReply",
            "ray.rpc.RemoveNodesFromVirtualClusterRequest",
            "ray.rpc.UpdateAutoscalingConfigReply",
            "ray.rpc.UpdateAutoscalingConfigRequest",
            "ray.rpc.UpdateAutoscalingConfigRequest.MaxReplicaSetsEntry",
            "ray.rpc.UpdateAutoscalingConfigRequest.MinReplicaSetsEntry",
            "ray.rpc.VirtualClusterTableData.MaxReplicaSetsEntry",
            "ray.rpc.VirtualClusterTableData.MinReplicaSetsEntry",
            "ray.rpc.autoscaler.ClusterResourceState.VirtualClusterStatesEntry",
            "ray.rpc.autoscaler.VirtualClusterState",
            "ray.rpc.autoscaler.VirtualClusterState.MaxReplicaSetsEntry",
            "ray.rpc.autoscaler.VirtualClusterState.MinReplicaSetsEntry",
            # _OURS
            "ray.rpc.VirtualClusterTableData.DeclaredReplicaSetsEntry",
        }
    ),
    methods=frozenset(
        {  # _NEWER_ANT_RAY
            ("ray.rpc.VirtualClusterInfoGcsService", "RemoveNodesFromVirtualCluster"),
            ("ray.rpc.VirtualClusterInfoGcsService", "UpdateAutoscalingConfig"),
            ("ray.rpc.VirtualClusterInfoGcsService", "GetAutoscalingConfig"),
        }
    ),
    # The actor scheduler only calls PushTask (scripts/gen_wire_protos.py SERVICE_METHODS).
    partial_services=frozenset({"ray.rpc.CoreWorkerService"}),
)


NOT_RAYS = frozenset({"otlp_metrics_pb2"})
"""Our protos that are not Ray's: OTLP's metrics subset (checked against opentelemetry-proto
in tests/server/test_ray_metrics.py)."""


def our_modules() -> list[str]:
    return sorted(
        f"gcs.proto.{m.name}"
        for m in pkgutil.iter_modules(gcs.proto.__path__)
        if m.name.endswith("_pb2") and m.name not in NOT_RAYS
    )


def dump_in_venv(venv: venvs.Venv, modules: list[str]) -> dict[str, Any]:
    source = open(descriptor_dump.__file__).read()  # noqa: SIM115 - tiny read
    script = f"{source}\nprint(json.dumps(dump_modules({modules!r})))\n"
    return venvs.run_in_venv(venv, script, timeout=120)


@pytest.fixture(scope="module")
def ray_dump(ray_venv: venvs.Venv, ray_wheel: pathlib.Path) -> dict[str, Any]:
    """Ray's modules, plus ``ray_syncer.proto``: the wheel has no ``ray_syncer_pb2``, its
    descriptor is read from the wheel's ``gcs_server`` binary."""
    dump = dump_in_venv(ray_venv, RAY_MODULES)
    syncer = syncer_descriptor_from_wheel(ray_wheel)
    descriptor_dump.dump_file(syncer, dump)
    return dump


@pytest.fixture(scope="module")
def ant_dump(ant_ray_venv: venvs.Venv) -> dict[str, Any]:
    # ant-ray 2.44 has no runtime_environment / profile_events modules; missing is fine.
    return dump_in_venv(ant_ray_venv, RAY_MODULES)


@pytest.fixture(scope="module")
def our_dump() -> dict[str, Any]:
    return renamed(descriptor_dump.dump_modules(our_modules()))


@pytest.mark.interop
class TestWireIdentity:
    def test_every_ray_module_is_readable(self, ray_dump: dict[str, Any]) -> None:
        """All nine Ray modules imported, so the comparison saw the whole protocol."""
        assert ray_dump["missing_modules"] == []
        assert "ray.rpc.autoscaler.AutoscalerStateService" in ray_dump["services"]
        assert ray_dump["services"]["ray.rpc.syncer.RaySyncer"]["StartSync"] == {
            "input": "ray.rpc.syncer.RaySyncMessageBatch",
            "output": "ray.rpc.syncer.RaySyncMessageBatch",
            "client_streaming": True,
            "server_streaming": True,
        }

    def test_our_descriptors_match_ray_and_ant_ray(
        self, our_dump: dict[str, Any], ray_dump: dict[str, Any], ant_dump: dict[str, Any]
    ) -> None:
        """Every message, enum and service of ours matches its reference field by field."""
        problems = compare(our_dump, ray_dump, ant_dump, ALLOWED)
        if problems:
            pytest.fail(f"{len(problems)} wire differences:\n" + "\n".join(problems))

    def test_allow_list_does_not_collide_with_the_references(
        self, ray_dump: dict[str, Any], ant_dump: dict[str, Any]
    ) -> None:
        """No listed addition reuses a Ray 2.60 number/name; ant-ray's numbers agree."""
        problems = allow_list_problems(ray_dump, ant_dump, ALLOWED)
        if problems:
            pytest.fail("\n".join(problems))

    def test_allow_listed_fields_ant_ray_has_are_defined_as_ant_ray_does(
        self, our_dump: dict[str, Any], ant_dump: dict[str, Any]
    ) -> None:
        """E.g. PubMessage.virtual_cluster_message: same type, oneof and label as ant-ray."""
        problems = ant_ray_field_mismatches(our_dump, ant_dump, ALLOWED)
        if problems:
            pytest.fail("\n".join(problems))

    def test_we_define_every_service_we_serve_with_all_ray_methods(
        self, our_dump: dict[str, Any], ray_dump: dict[str, Any]
    ) -> None:
        """The services we carry over exist in ours with Ray's full method list."""
        for service in (
            "ray.rpc.syncer.RaySyncer",
            "ray.rpc.NodeInfoGcsService",
            "ray.rpc.autoscaler.AutoscalerStateService",
            "ray.rpc.NodeManagerService",
            "ray.rpc.InternalKVGcsService",
        ):
            assert set(our_dump["services"][service]) >= set(ray_dump["services"][service])


class TestOurPackage:
    def test_no_message_of_ours_lives_in_a_ray_package(self) -> None:
        """Our protos load next to ``ray``'s because every name is under ``gcs.``."""
        dump = descriptor_dump.dump_modules(our_modules())
        assert dump["missing_modules"] == []
        offenders = [
            name
            for kind in ("messages", "enums", "services")
            for name in dump[kind]
            if not name.startswith("gcs.")
        ]
        assert offenders == []
        assert len(dump["messages"]) > 100

    def test_our_files_import_no_ray_proto(self) -> None:
        """No generated file depends on a ``ray/...`` or ``src/ray/...`` proto file."""
        for name in our_modules():
            fd = descriptor_pb2.FileDescriptorProto.FromString(
                importlib.import_module(name).DESCRIPTOR.serialized_pb
            )
            assert fd.package.startswith("gcs."), name
            assert all(dep.startswith(("gcs/", "google/")) for dep in fd.dependency), name
