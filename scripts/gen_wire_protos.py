"""Regenerate ``protos/gcs/proto/*.proto`` from the descriptors inside a Ray wheel.

The wire format (message names, field names, numbers, types, labels, oneofs) is a fact we
must match exactly; transcribing hundreds of fields by hand invites mistakes, so this script
reads the serialized ``FileDescriptorProto`` blobs shipped in ``ray/core/generated/*_pb2.py``
(no Ray code is imported or copied), keeps only the messages reachable from the services we
serve or call, renames the proto package ``ray.*`` -> ``gcs.*`` (so our modules can share a
process with ``ray``), and prints them as proto3 source.

Usage: python scripts/gen_wire_protos.py /path/to/unzipped/ray/core/generated protos/gcs/proto
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys
from collections import defaultdict

from google.protobuf import descriptor_pb2 as d

SERVICES = {
    "ray.rpc.JobInfoGcsService",
    "ray.rpc.ActorInfoGcsService",
    "ray.rpc.WorkerInfoGcsService",
    "ray.rpc.PlacementGroupInfoGcsService",
    "ray.rpc.InternalKVGcsService",
    "ray.rpc.RuntimeEnvGcsService",
    "ray.rpc.ControlPlanePubSubGcsService",
    "ray.rpc.ObservabilityPubSubService",
    "ray.rpc.NodeResourceInfoGcsService",
    "ray.rpc.NodeInfoGcsService",
    "ray.rpc.TaskInfoGcsService",
    "ray.rpc.NodeManagerService",
    "ray.rpc.autoscaler.AutoscalerStateService",
    "ray.rpc.CoreWorkerService",
}
# Services of which we call only some methods (the rest, and what only they reach, left out).
SERVICE_METHODS: dict[str, set[str]] = {
    # The GCS actor scheduler pushes the creation task to the leased worker; GetAllJobInfo
    # asks each running driver for its pending tasks (is_running_tasks).
    "ray.rpc.CoreWorkerService": {"PushTask", "NumPendingTasks"},
}
# Messages we use directly although no service method reaches them.
EXTRA_MESSAGES = {
    "ray.rpc.autoscaler.ClusterResourceState",
    "ray.rpc.autoscaler.AutoscalingState",
}
# Additive extensions (Ray 2.60 leaves these numbers unused), each with its source.  The
# descriptor test allow-lists exactly these.  ant-ray's PlacementGroup{Spec,TableData}
# virtual_cluster_id (12 / 17) collide with Ray 2.60's topology fields, so Ray wins there and
# our placement-group manager keeps the VC id in its own record.
ADDITIONS: dict[str, list[str]] = {
    # ant-ray 2.44: jobs run in a virtual cluster.
    "ray.rpc.JobTableData": ["string virtual_cluster_id = 13;"],
    # ant-ray 2.44: tasks/actors scheduled inside a virtual cluster.
    "ray.rpc.SchedulingStrategy": ["string virtual_cluster_id = 11;"],
    # ant-ray 2.44: virtual-cluster scope for resource views.
    "ray.rpc.GetAllAvailableResourcesRequest": ["string virtual_cluster_id = 1;"],
    "ray.rpc.GetAllTotalResourcesRequest": ["string virtual_cluster_id = 1;"],
    # ant-ray 2.44: GetAllNodeInfo filters (only the additive field 4; its `limit = 3`
    # collides with Ray's state_filter and is not taken).
    "ray.rpc.GetAllNodeInfoRequest": [
        "message Filters {",
        "  optional bytes node_id = 1;",
        "  optional .gcs.rpc.GcsNodeInfo.GcsNodeState state = 2;",
        "  optional string node_name = 3;",
        "  optional string node_ip_address = 4;",
        "  optional string virtual_cluster_id = 5;",
        "}",
        "optional .gcs.rpc.GetAllNodeInfoRequest.Filters filters = 4;",
    ],
}
# gcs's own (from 100): the job whose queued requests a load row counts, so that demand is
# booked to a virtual cluster only when its job runs in one (a Ray raylet leaves it unset).
ADDITIONS["ray.rpc.ResourceDemand"] = ["bytes job_id = 100;"]
# ant-ray's per-virtual-cluster autoscaler state (Ray 2.60's ClusterResourceState ends at 7).
ADDITIONS["ray.rpc.autoscaler.ClusterResourceState"] = [
    "map<string, .gcs.rpc.autoscaler.VirtualClusterState> virtual_cluster_states = 8;",
]
ONEOF_ADDITIONS: dict[tuple[str, str], list[str]] = {
    # ant-ray's virtual-cluster payload keeps its number (Ray 2.60 stops at 14).
    ("ray.rpc.PubMessage", "inner_message"): [
        ".gcs.rpc.VirtualClusterTableData virtual_cluster_message = 20;"
    ],
}
# Hand-written files our generated ones import for the additions above.
EXTRA_IMPORTS: dict[str, list[str]] = {"pubsub": ["gcs/proto/virtual_cluster_data.proto"]}
# Whole messages appended to a generated file (ant-ray additive, not in Ray 2.60).
EXTRA_TEXT: dict[str, str] = {
    "autoscaler": """// addition (ant-ray): one virtual cluster as the VC-aware autoscaler sees it.
message VirtualClusterState {
  string parent_virtual_cluster_id = 1;
  bool divisible = 2;
  uint64 revision = 3;
  repeated string nodes = 4;
  repeated .gcs.rpc.autoscaler.ResourceRequestByCount pending_resource_requests = 5;
  repeated .gcs.rpc.autoscaler.GangResourceRequest pending_gang_resource_requests = 6;
  map<string, int32> min_replica_sets = 7;
  map<string, int32> max_replica_sets = 8;
  int32 max_nodes = 9;
}
""",
}
ENUM_ADDITIONS: dict[str, list[str]] = {
    # ant-ray's virtual-cluster channel keeps its number (Ray 2.60 stops at 9).
    "ray.rpc.ChannelType": ["RAY_VIRTUAL_CLUSTER_CHANNEL = 11;"],
}

SCALAR = {
    d.FieldDescriptorProto.TYPE_DOUBLE: "double",
    d.FieldDescriptorProto.TYPE_FLOAT: "float",
    d.FieldDescriptorProto.TYPE_INT64: "int64",
    d.FieldDescriptorProto.TYPE_UINT64: "uint64",
    d.FieldDescriptorProto.TYPE_INT32: "int32",
    d.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    d.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    d.FieldDescriptorProto.TYPE_BOOL: "bool",
    d.FieldDescriptorProto.TYPE_STRING: "string",
    d.FieldDescriptorProto.TYPE_BYTES: "bytes",
    d.FieldDescriptorProto.TYPE_UINT32: "uint32",
    d.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    d.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    d.FieldDescriptorProto.TYPE_SINT32: "sint32",
    d.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def rename(name: str) -> str:
    """``.ray.rpc.X`` -> ``.gcs.rpc.X`` (also bare package names)."""
    return re.sub(r"^(\.?)ray\.", r"\1gcs.", name)


def load(root: pathlib.Path) -> dict[str, d.FileDescriptorProto]:
    files = {}
    for path in sorted(root.glob("*_pb2.py")):
        match = re.search(r"AddSerializedFile\((b'.*?')\)\n", path.read_text(), re.S)
        if match:
            fd = d.FileDescriptorProto.FromString(ast.literal_eval(match.group(1)))
            files[fd.name] = fd
    return files


class Index:
    def __init__(self, files: dict[str, d.FileDescriptorProto]) -> None:
        self.messages: dict[str, tuple[str, d.DescriptorProto]] = {}
        self.enums: dict[str, tuple[str, d.EnumDescriptorProto]] = {}
        self.services: dict[str, tuple[str, d.ServiceDescriptorProto]] = {}
        for fd in files.values():
            prefix = "." + fd.package
            for m in fd.message_type:
                self._add_message(fd.name, prefix, m)
            for e in fd.enum_type:
                self.enums[f"{prefix}.{e.name}"] = (fd.name, e)
            for s in fd.service:
                self.services[f"{fd.package}.{s.name}"] = (fd.name, s)

    def _add_message(self, file: str, prefix: str, m: d.DescriptorProto) -> None:
        full = f"{prefix}.{m.name}"
        self.messages[full] = (file, m)
        for n in m.nested_type:
            self._add_message(file, full, n)
        for e in m.enum_type:
            self.enums[f"{full}.{e.name}"] = (file, e)


def top_level(name: str, index: Index) -> str:
    """The outermost message (or enum) that contains ``name``."""
    parts = name.split(".")
    for i in range(2, len(parts) + 1):
        cand = ".".join(parts[:i])
        if cand in index.messages or cand in index.enums:
            return cand
    raise KeyError(name)


def methods_of(svc: str, index: Index) -> list[d.MethodDescriptorProto]:
    wanted = SERVICE_METHODS.get(svc)
    return [m for m in index.services[svc][1].method if wanted is None or m.name in wanted]


def closure(index: Index) -> set[str]:
    todo = list(EXTRA_MESSAGES and {"." + m for m in EXTRA_MESSAGES})
    for svc in SERVICES:
        for method in methods_of(svc, index):
            todo += [method.input_type, method.output_type]
    seen: set[str] = set()
    while todo:
        name = top_level(todo.pop(), index)
        if name in seen:
            continue
        seen.add(name)
        if name in index.messages:
            stack = [(name, index.messages[name][1])]
            while stack:
                full, msg = stack.pop()
                todo += [f.type_name for f in msg.field if f.type_name]
                stack += [(f"{full}.{n.name}", n) for n in msg.nested_type]
    return seen


def field_type(f: d.FieldDescriptorProto) -> str:
    if f.type_name:
        return rename(f.type_name)
    return SCALAR[f.type]


def print_enum(e: d.EnumDescriptorProto, ind: str, out: list[str], full: str = "") -> None:
    out.append(f"{ind}enum {e.name} {{")
    if e.options.allow_alias:
        out.append(f"{ind}  option allow_alias = true;")
    for v in e.value:
        out.append(f"{ind}  {v.name} = {v.number};")
    for line in ENUM_ADDITIONS.get(full, []):
        out.append(f"{ind}  {line}  // addition")
    out.append(f"{ind}}}")


def print_message(m: d.DescriptorProto, ind: str, out: list[str], full: str = "") -> None:
    maps = {n.name: n for n in m.nested_type if n.options.map_entry}
    out.append(f"{ind}message {m.name} {{")
    for n in m.nested_type:
        if not n.options.map_entry:
            print_message(n, ind + "  ", out)
    for e in m.enum_type:
        print_enum(e, ind + "  ", out)
    real_oneofs: dict[int, list[d.FieldDescriptorProto]] = defaultdict(list)
    emitted_oneofs: set[int] = set()
    for f in m.field:
        if f.HasField("oneof_index") and not f.proto3_optional:
            real_oneofs[f.oneof_index].append(f)
    for f in m.field:
        if f.HasField("oneof_index") and not f.proto3_optional:
            idx = f.oneof_index
            if idx in emitted_oneofs:
                continue
            emitted_oneofs.add(idx)
            out.append(f"{ind}  oneof {m.oneof_decl[idx].name} {{")
            for g in real_oneofs[idx]:
                out.append(f"{ind}    {field_type(g)} {g.name} = {g.number};")
            for line in ONEOF_ADDITIONS.get((full, m.oneof_decl[idx].name), []):
                out.append(f"{ind}    {line}  // addition")
            out.append(f"{ind}  }}")
            continue
        entry_name = f.type_name.rsplit(".", 1)[-1] if f.type_name else ""
        if f.label == d.FieldDescriptorProto.LABEL_REPEATED and entry_name in maps:
            entry = maps[entry_name]
            key, value = entry.field[0], entry.field[1]
            out.append(f"{ind}  map<{field_type(key)}, {field_type(value)}> {f.name} = {f.number};")
            continue
        label = ""
        if f.label == d.FieldDescriptorProto.LABEL_REPEATED:
            label = "repeated "
        elif f.proto3_optional:
            label = "optional "
        opts = " [deprecated = true]" if f.options.deprecated else ""
        out.append(f"{ind}  {label}{field_type(f)} {f.name} = {f.number}{opts};")
    for line in ADDITIONS.get(full, []):
        out.append(f"{ind}  {line}  // addition")
    out.append(f"{ind}}}")


def main(src: str, dst: str) -> None:
    files = load(pathlib.Path(src))
    index = Index(files)
    keep = closure(index)
    by_file: dict[str, list[str]] = defaultdict(list)
    for name in keep:
        file = (index.messages.get(name) or index.enums[name])[0]
        by_file[file].append(name)
    for svc in SERVICES:
        by_file.setdefault(index.services[svc][0], [])
    out_dir = pathlib.Path(dst)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = {f: pathlib.Path(f).stem for f in by_file}
    for file, members in sorted(by_file.items()):
        fd = files[file]
        body: list[str] = []
        order = {}
        for i, m in enumerate(fd.enum_type):
            order[f".{fd.package}.{m.name}"] = (0, i)
        for i, m in enumerate(fd.message_type):
            order[f".{fd.package}.{m.name}"] = (1, i)
        for name in sorted(members, key=order.__getitem__):
            full = name.lstrip(".")
            if name in index.enums:
                print_enum(index.enums[name][1], "", body, full)
            else:
                print_message(index.messages[name][1], "", body, full)
            body.append("")
        for s in fd.service:
            if f"{fd.package}.{s.name}" not in SERVICES:
                continue
            body.append(f"service {s.name} {{")
            for mth in methods_of(f"{fd.package}.{s.name}", index):
                req, rep = rename(mth.input_type), rename(mth.output_type)
                body.append(f"  rpc {mth.name}({req}) returns ({rep});")
            body.append("}")
            body.append("")
        body.append(EXTRA_TEXT.get(names[file], ""))
        text = "\n".join(body)
        deps = sorted(
            dep
            for dep in fd.dependency
            if dep in names and re.search(rf"\.{re.escape(rename(files[dep].package))}\.", text)
        )
        header = [
            "// Generated by scripts/gen_wire_protos.py from the Ray 2.60.0 wheel's descriptors.",
            "// Wire-identical to Ray; the package is renamed so both can load in one process.",
            'syntax = "proto3";',
            "",
            f"package {rename(fd.package)};",
            "",
        ]
        header += [f'import "gcs/proto/{names[dep]}.proto";' for dep in deps]
        header += [f'import "{extra}";' for extra in EXTRA_IMPORTS.get(names[file], [])]
        (out_dir / f"{names[file]}.proto").write_text("\n".join(header) + "\n\n" + text)
        print(f"{names[file]}.proto: {len(members)} top-level types")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
