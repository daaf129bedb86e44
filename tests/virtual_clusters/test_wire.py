"""Our virtual-cluster protos are wire-identical to the ant-ray 2.44.1.1 wheel's.

The wheel's ``ray/core/generated/*_pb2.py`` embed serialized ``FileDescriptorProto`` blobs; we
parse those bytes (never import ant-ray) and compare every field of every VC message.
"""

from __future__ import annotations

import ast
import pathlib
import re
import zipfile

import pytest
from google.protobuf import descriptor_pb2 as d

from gcs.proto import autoscaler_pb2, pubsub_pb2, virtual_cluster_data_pb2, virtual_cluster_pb2
from gcs.rpc import method_path
from gcs.rpc.descriptors import VIRTUAL_CLUSTER_INFO

SERVICE_MESSAGES = (
    "CreateOrUpdateVirtualClusterRequest",
    "CreateOrUpdateVirtualClusterReply",
    "RemoveVirtualClusterRequest",
    "RemoveVirtualClusterReply",
    "NodeInstanceView",
    "VirtualClusterView",
    "GetAllVirtualClusterInfoRequest",
    "GetAllVirtualClusterInfoReply",
    "GetVirtualClustersRequest",
    "GetVirtualClustersReply",
    "CreateJobClusterRequest",
    "CreateJobClusterReply",
)
NEWER_METHODS = {"RemoveNodesFromVirtualCluster", "UpdateAutoscalingConfig", "GetAutoscalingConfig"}
EXTENSION_FLOOR = 100
"""Our own fields (gcs extensions) are numbered from here; ant-ray's readers skip them."""
GCS_EXTENSIONS = {
    "CreateOrUpdateVirtualClusterRequest": {100: "autoscaler_move", 101: "must_exist"},
    "RemoveNodesFromVirtualClusterRequest": {100: "revision", 101: "autoscaler_move"},
    "VirtualClusterTableData": {100: "declared_replica_sets"},
}


def without_extensions(facts: dict) -> dict:
    """``message_facts`` minus the gcs extension fields (numbers >= ``EXTENSION_FLOOR``)."""
    fields = {n: f for n, f in facts["fields"].items() if n < EXTENSION_FLOOR}
    return {**facts, "fields": fields}


def wheel_descriptor(wheel: pathlib.Path, module: str) -> d.FileDescriptorProto:
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(f"ray/core/generated/{module}_pb2.py").decode()
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", text, re.S)
    assert match, f"no serialized descriptor in {module}_pb2.py"
    return d.FileDescriptorProto.FromString(ast.literal_eval(match.group(1)))


def ours(module) -> d.FileDescriptorProto:  # type: ignore[no-untyped-def]
    fd = d.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fd)
    return fd


def renamed(type_name: str) -> str:
    return re.sub(r"^\.ray\.", ".gcs.", type_name)


def field_facts(f: d.FieldDescriptorProto) -> tuple:
    return (f.name, f.number, f.type, f.label, renamed(f.type_name), f.proto3_optional)


def message_facts(m: d.DescriptorProto) -> dict:
    """Fields plus nested (map entry) types, comparable across the package rename."""
    return {
        "fields": {f.number: field_facts(f) for f in m.field},
        "nested": {n.name: message_facts(n) for n in m.nested_type},
        "map_entry": m.options.map_entry,
    }


def by_name(fd: d.FileDescriptorProto) -> dict[str, d.DescriptorProto]:
    return {m.name: m for m in fd.message_type}


class TestTableDataWire:
    def test_node_instance_matches_ant_ray(self, ant_ray_wheel: pathlib.Path) -> None:
        """NodeInstance has ant-ray's fields, numbers and types."""
        theirs = by_name(wheel_descriptor(ant_ray_wheel, "gcs"))["NodeInstance"]
        mine = by_name(ours(virtual_cluster_data_pb2))["NodeInstance"]
        assert message_facts(mine) == message_facts(theirs)

    def test_table_data_fields_1_to_5_match_ant_ray(self, ant_ray_wheel: pathlib.Path) -> None:
        """VirtualClusterTableData fields 1-5 (and the map entry) equal the wheel's."""
        theirs = message_facts(
            by_name(wheel_descriptor(ant_ray_wheel, "gcs"))["VirtualClusterTableData"]
        )
        mine = message_facts(by_name(ours(virtual_cluster_data_pb2))["VirtualClusterTableData"])
        assert set(theirs["fields"]) == {1, 2, 3, 4, 5}
        for number, facts in theirs["fields"].items():
            assert mine["fields"][number] == facts
        for name, nested in theirs["nested"].items():
            assert mine["nested"][name] == nested

    def test_table_data_newer_fields_are_additive_autoscaling_config(self) -> None:
        """Fields 6-8 are ant-ray's later min/max replica sets and max_nodes; 100 is ours."""
        fields = virtual_cluster_data_pb2.VirtualClusterTableData.DESCRIPTOR.fields_by_number
        assert sorted(fields) == [1, 2, 3, 4, 5, 6, 7, 8, 100]
        assert [fields[n].name for n in (6, 7, 8)] == [
            "min_replica_sets",
            "max_replica_sets",
            "max_nodes",
        ]
        assert fields[8].type == fields[8].TYPE_INT32


class TestServiceWire:
    @pytest.mark.parametrize("name", SERVICE_MESSAGES)
    def test_request_and_reply_match_ant_ray(self, ant_ray_wheel: pathlib.Path, name: str) -> None:
        """Every field of each VC request/reply equals the wheel's, modulo ray->gcs, besides
        our extensions (numbered from 100, so an ant-ray peer skips them)."""
        theirs = by_name(wheel_descriptor(ant_ray_wheel, "gcs_service"))[name]
        mine = by_name(ours(virtual_cluster_pb2))[name]
        assert without_extensions(message_facts(mine)) == message_facts(theirs)
        assert max(message_facts(theirs)["fields"]) < EXTENSION_FLOOR

    @pytest.mark.parametrize("name", sorted(GCS_EXTENSIONS))
    def test_extensions_are_the_documented_ones(self, name: str) -> None:
        """The only fields numbered from 100, by message."""
        modules = (virtual_cluster_pb2, virtual_cluster_data_pb2)
        (message,) = [by_name(ours(m))[name] for m in modules if name in by_name(ours(m))]
        extensions = {f.number: f.name for f in message.field if f.number >= EXTENSION_FLOOR}
        assert extensions == GCS_EXTENSIONS[name]

    def test_service_methods_match_ant_ray_plus_newer_ones(
        self, ant_ray_wheel: pathlib.Path
    ) -> None:
        """The wheel's 5 methods exist with the same types; ours adds exactly the 3 newer."""
        fd = wheel_descriptor(ant_ray_wheel, "gcs_service")
        (service,) = [s for s in fd.service if s.name == "VirtualClusterInfoGcsService"]
        theirs = {m.name: (renamed(m.input_type), renamed(m.output_type)) for m in service.method}
        mine = {
            m.name: ("." + m.input_type.full_name, "." + m.output_type.full_name)
            for m in VIRTUAL_CLUSTER_INFO.methods
        }
        assert {k: mine[k] for k in theirs} == theirs
        assert set(mine) - set(theirs) == NEWER_METHODS

    def test_method_paths_use_ray_package(self) -> None:
        """All 8 RPCs are served on ant-ray's /ray.rpc.VirtualClusterInfoGcsService paths."""
        paths = sorted(method_path(m) for m in VIRTUAL_CLUSTER_INFO.methods)
        assert len(paths) == 8
        assert all(p.startswith("/ray.rpc.VirtualClusterInfoGcsService/") for p in paths)


class TestPubsubWire:
    def test_virtual_cluster_channel_matches_ant_ray(self, ant_ray_wheel: pathlib.Path) -> None:
        """RAY_VIRTUAL_CLUSTER_CHANNEL keeps ant-ray's number."""
        fd = wheel_descriptor(ant_ray_wheel, "pubsub")
        (channel,) = [e for e in fd.enum_type if e.name == "ChannelType"]
        theirs = {v.name: v.number for v in channel.value}["RAY_VIRTUAL_CLUSTER_CHANNEL"]
        assert pubsub_pb2.RAY_VIRTUAL_CLUSTER_CHANNEL == theirs == 11

    def test_pub_message_field_matches_ant_ray(self, ant_ray_wheel: pathlib.Path) -> None:
        """PubMessage.virtual_cluster_message has ant-ray's number and type, in the oneof."""
        fd = wheel_descriptor(ant_ray_wheel, "pubsub")
        theirs = {f.name: f for f in by_name(fd)["PubMessage"].field}["virtual_cluster_message"]
        mine = pubsub_pb2.PubMessage.DESCRIPTOR.fields_by_name["virtual_cluster_message"]
        assert (mine.number, "." + mine.message_type.full_name) == (
            theirs.number,
            renamed(theirs.type_name),
        )
        assert mine.containing_oneof is not None
        assert mine.containing_oneof.name == "inner_message"

    def test_ray_260_pubsub_numbers_are_untouched(self) -> None:
        """The additions do not collide with Ray 2.60's channel or oneof numbers."""
        values = pubsub_pb2.ChannelType.DESCRIPTOR.values_by_number
        assert values[9].name == "GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL"
        assert values[11].name == "RAY_VIRTUAL_CLUSTER_CHANNEL"
        numbers = [f.number for f in pubsub_pb2.PubMessage.DESCRIPTOR.fields]
        assert len(numbers) == len(set(numbers))


class TestAutoscalerWire:
    def test_cluster_resource_state_carries_per_vc_states_at_8(self) -> None:
        """ant-ray's additive map sits at field 8, after Ray 2.60's seven fields."""
        field = autoscaler_pb2.ClusterResourceState.DESCRIPTOR.fields_by_name[
            "virtual_cluster_states"
        ]
        assert field.number == 8
        assert field.message_type.GetOptions().map_entry
        value = field.message_type.fields_by_name["value"].message_type
        assert value.full_name == "gcs.rpc.autoscaler.VirtualClusterState"
        assert [f.number for f in value.fields] == list(range(1, 10))
