"""``gcs`` and ``ray`` load into one interpreter without descriptor-pool conflicts.

A driver may ``import ray`` and use our SDK in the same process.  protobuf refuses two
definitions of one full name, so this only works because our package is ``gcs.rpc``.
"""

from __future__ import annotations

import pytest

from tests.interop import venvs
from tests.interop.fixtures import VenvWithGcs

SCRIPT = r"""
import json, pkgutil, importlib
import ray
from ray._raylet import GcsClient
import ray.autoscaler.v2.sdk
import ray.core.generated as ray_generated
import ray.core.generated.autoscaler_pb2 as ray_autoscaler
import gcs.proto
import gcs.proto.autoscaler_pb2 as our_autoscaler
import gcs.sdk
from google.protobuf import descriptor_pool

ray_mods = [m.name for m in pkgutil.iter_modules(ray_generated.__path__) if m.name.endswith("_pb2")]
failed = {}
for name in ray_mods:
    try:
        importlib.import_module("ray.core.generated." + name)
    except Exception as exc:  # record, the test decides
        failed[name] = repr(exc)
ours = [m.name for m in pkgutil.iter_modules(gcs.proto.__path__) if m.name.endswith("_pb2")]
for name in ours:
    importlib.import_module("gcs.proto." + name)

mine = our_autoscaler.ResourceRequest(resources_bundle={"CPU": 2.0, "GPU": 1.0})
sel = mine.label_selectors.add()
sel.label_constraints.add(label_key="zone", operator=1, label_values=["a"])
cross = ray_autoscaler.ResourceRequest.FromString(mine.SerializeToString(deterministic=True))
back = our_autoscaler.ResourceRequest.FromString(cross.SerializeToString(deterministic=True))
request = gcs.sdk.build_constraint_request(2, [{"GPU": 1}], None)
pool = descriptor_pool.Default()
print(json.dumps({
    "ray_version": ray.__version__,
    "gcs_file": gcs.__file__,
    "ray_modules": len(ray_mods),
    "failed_ray_modules": failed,
    "our_modules": len(ours),
    "ray_full_name": ray_autoscaler.ResourceRequest.DESCRIPTOR.full_name,
    "our_full_name": our_autoscaler.ResourceRequest.DESCRIPTOR.full_name,
    "both_in_pool": [
        pool.FindMessageTypeByName("ray.rpc.autoscaler.ResourceRequest").full_name,
        pool.FindMessageTypeByName("gcs.rpc.autoscaler.ResourceRequest").full_name,
    ],
    "round_trip_equal": back == mine,
    "cross_selector_key": cross.label_selectors[0].label_constraints[0].label_key,
    "ray_parses_sdk_request": str(
        ray_autoscaler.RequestClusterResourceConstraintRequest.FromString(
            request.SerializeToString()
        ).cluster_resource_constraint.resource_requests[0].count
    ),
}))
"""


@pytest.mark.interop
class TestSameProcess:
    @pytest.fixture(scope="class")
    @classmethod
    def result(cls, ray_venv_with_gcs: VenvWithGcs) -> dict:
        return ray_venv_with_gcs.run(SCRIPT, timeout=180)

    def test_our_checkout_is_the_gcs_that_was_imported(self, result: dict) -> None:
        """The venv imported this repository's ``gcs``, next to the real Ray 2.60."""
        assert result["ray_version"] == "2.60.0"
        assert result["gcs_file"].startswith(str(venvs.REPO_ROOT))

    def test_all_modules_of_both_load_in_one_pool(self, result: dict) -> None:
        """Every Ray ``*_pb2`` and every one of ours imports; both names are in the pool."""
        assert result["failed_ray_modules"] == {}
        assert result["ray_modules"] >= 9
        assert result["our_modules"] >= 9
        assert result["both_in_pool"] == [
            "ray.rpc.autoscaler.ResourceRequest",
            "gcs.rpc.autoscaler.ResourceRequest",
        ]

    def test_messages_of_both_interoperate_on_bytes(self, result: dict) -> None:
        """Bytes from our message parse as Ray's and back unchanged."""
        assert result["our_full_name"] == "gcs.rpc.autoscaler.ResourceRequest"
        assert result["ray_full_name"] == "ray.rpc.autoscaler.ResourceRequest"
        assert result["round_trip_equal"] is True
        assert result["cross_selector_key"] == "zone"
        assert result["ray_parses_sdk_request"] == "2"
