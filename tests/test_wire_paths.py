"""Our renamed proto package still serves and calls Ray's gRPC method paths."""

from gcs.rpc import method_path, wire_service_name
from gcs.rpc.descriptors import AUTOSCALER_STATE, NODE_INFO, NODE_MANAGER


class TestWirePaths:
    def test_proto_package_is_ours(self) -> None:
        """Messages live in gcs.rpc so they can load next to ray.rpc in one process."""
        assert NODE_INFO.full_name == "gcs.rpc.NodeInfoGcsService"
        assert AUTOSCALER_STATE.full_name == "gcs.rpc.autoscaler.AutoscalerStateService"

    def test_method_paths_are_rays(self) -> None:
        """The path on the wire names Ray's package."""
        assert wire_service_name(NODE_MANAGER) == "ray.rpc.NodeManagerService"
        method = AUTOSCALER_STATE.methods_by_name["GetClusterResourceState"]
        assert method_path(method) == (
            "/ray.rpc.autoscaler.AutoscalerStateService/GetClusterResourceState"
        )
