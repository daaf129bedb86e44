"""The public surface of ``gcs.sdk`` is pinned."""

import gcs.sdk


class TestExports:
    def test_all_lists_exactly_the_public_names(self) -> None:
        """Adding or removing a public name is a deliberate change to this list."""
        assert gcs.sdk.__all__ == [
            "HA_LEADER_KEY",
            "HA_NAMESPACE",
            "AddressNotFound",
            "AsyncGcsClient",
            "ClusterStatusSummary",
            "GcsClient",
            "GcsSdkError",
            "ResourceDemand",
            "RpcError",
            "build_constraint_request",
            "get_autoscaler_events",
            "get_autoscaler_waiting",
            "get_autoscaler_waiting_async",
            "get_cluster_status",
            "get_cluster_status_async",
            "get_ha_leader",
            "request_resources",
            "request_resources_async",
            "resolve_address",
            "validate_request",
        ]

    def test_all_is_sorted_and_every_name_resolves(self) -> None:
        """``__all__`` stays sorted (as ruff sorts it: constants, classes, functions) and names
        only things the package really exports."""

        def kind(name: str) -> tuple[int, str]:
            return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

        assert gcs.sdk.__all__ == sorted(gcs.sdk.__all__, key=kind)
        for name in gcs.sdk.__all__:
            assert getattr(gcs.sdk, name) is not None

    def test_public_modules_are_private_underscored(self) -> None:
        """Implementation lives in ``_name`` modules; only ``__init__`` is public."""
        public = {
            name
            for name, value in vars(gcs.sdk).items()
            if getattr(value, "__name__", "").startswith("gcs.sdk.") and not name.startswith("_")
        }
        assert public == set()
