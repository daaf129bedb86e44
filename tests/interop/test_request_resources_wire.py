"""``gcs.sdk.request_resources`` matches Ray 2.60's own, on errors and on the wire.

Ray's ``ray.autoscaler.sdk.request_resources`` runs in the Ray venv: for bad arguments as is
(validation comes before its ``ray.init()`` check), for good ones with ``ray.init()`` and the
v2-autoscaler switch patched so its real conversion and C++ ``GcsClient`` talk to a recording
GCS started by this test.  Our SDK then sends the same cases to the same recorder.

Ray orders map entries, selector constraints and ``in(...)`` values by hash, which changes
from process to process; requests are therefore compared in a canonical order (sorted
constraints and values, deterministic map order), and byte for byte wherever a message has
no such ordering freedom.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gcs.proto import autoscaler_pb2
from gcs.sdk import request_resources_async, validate_request
from gcs.testing.recording_gcs import RecordingGcs
from tests.interop import venvs
from tests.sdk.cases import BAD_ARGUMENTS, GOOD_ARGUMENTS

RAY_ERRORS_SCRIPT = r"""
import ast, json, sys
from ray.autoscaler.sdk import request_resources
out = {}
for case_id, kwargs in ast.literal_eval(CASES):
    try:
        request_resources(**kwargs)
        out[case_id] = ["no error", ""]
    except Exception as exc:
        out[case_id] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""

RAY_SEND_SCRIPT = r"""
import ast, json
import ray
import ray.autoscaler.v2.utils
from ray.autoscaler._private import commands
from ray.autoscaler.sdk import request_resources

class _Client:
    address = GCS_ADDRESS

ray.is_initialized = lambda: True
ray.autoscaler.v2.utils.is_autoscaler_v2 = lambda *a, **k: True
commands.internal_kv_get_gcs_client = lambda: _Client()
for case_id, kwargs in ast.literal_eval(CASES):
    request_resources(**kwargs)
print(json.dumps({"sent": len(ast.literal_eval(CASES))}))
"""


def _with(script: str, **constants: Any) -> str:
    header = "".join(f"{name} = {value!r}\n" for name, value in constants.items())
    return header + script


def canonical(raw: bytes) -> tuple[bytes, bool]:
    """(bytes in canonical order, whether the message had any ordering freedom)."""
    msg = autoscaler_pb2.RequestClusterResourceConstraintRequest.FromString(raw)
    free = False
    for group in msg.cluster_resource_constraint.resource_requests:
        free |= len(group.request.resources_bundle) > 1
        for selector in group.request.label_selectors:
            constraints = sorted(selector.label_constraints, key=lambda c: c.label_key)
            free |= len(constraints) > 1
            copies = []
            for c in constraints:
                free |= len(c.label_values) > 1
                copy = type(c)()
                copy.CopyFrom(c)
                copy.label_values[:] = sorted(c.label_values)
                copies.append(copy)
            del selector.label_constraints[:]
            selector.label_constraints.extend(copies)
    return msg.SerializeToString(deterministic=True), free


@pytest.mark.interop
class TestSameErrorsAsRay:
    @pytest.fixture(scope="class")
    @classmethod
    def ray_errors(cls, ray_venv: venvs.Venv) -> dict[str, list[str]]:
        cases = [(case_id, kwargs) for case_id, kwargs, _, _ in BAD_ARGUMENTS]
        cases += [(case_id, kwargs) for case_id, kwargs in GOOD_ARGUMENTS]
        return venvs.run_in_venv(ray_venv, _with(RAY_ERRORS_SCRIPT, CASES=repr(cases)))

    @pytest.mark.parametrize(
        ("case_id", "kwargs"), [(i, k) for i, k, _, _ in BAD_ARGUMENTS], ids=lambda v: str(v)[:30]
    )
    def test_bad_arguments_fail_with_rays_exact_error(
        self, ray_errors: dict[str, list[str]], case_id: str, kwargs: dict[str, Any]
    ) -> None:
        """Our validation raises what Ray 2.60 raises, type and message."""
        with pytest.raises(Exception) as info:
            validate_request(**kwargs)
        assert [type(info.value).__name__, str(info.value)] == ray_errors[case_id]

    @pytest.mark.parametrize("case_id", [i for i, _ in GOOD_ARGUMENTS])
    def test_good_arguments_pass_rays_validation(
        self, ray_errors: dict[str, list[str]], case_id: str
    ) -> None:
        """Cases we accept get past Ray's checks too (stopping at its ray.init() check)."""
        assert ray_errors[case_id] == ["RuntimeError", "Ray is not initialized yet"]


@pytest.mark.interop
class TestSameWireMessageAsRay:
    async def test_each_case_sends_the_same_request_as_ray(self, ray_venv: venvs.Venv) -> None:
        """Ray's conversion and ours produce the same RequestClusterResourceConstraint."""
        cases = [(case_id, kwargs) for case_id, kwargs in GOOD_ARGUMENTS]
        async with RecordingGcs() as gcs:
            script = _with(RAY_SEND_SCRIPT, CASES=repr(cases), GCS_ADDRESS=gcs.address)
            await asyncio.to_thread(venvs.run_in_venv, ray_venv, script)
            theirs = gcs.calls_to("RequestClusterResourceConstraint")
            for _, kwargs in cases:
                await request_resources_async(**kwargs, address=gcs.address)
            ours = gcs.calls_to("RequestClusterResourceConstraint")[len(theirs) :]
        assert len(theirs) == len(ours) == len(cases)
        for (case_id, _), ray_call, our_call in zip(cases, theirs, ours, strict=True):
            ray_bytes, free = canonical(ray_call.raw)
            our_bytes, _ = canonical(our_call.raw)
            assert our_bytes == ray_bytes, (
                f"{case_id}:\nRay:\n{ray_call.request}\nours:\n{our_call.request}"
            )
            if not free:
                assert our_call.raw == ray_call.raw, case_id
            assert our_call.metadata_value("ray_cluster_id") == ray_call.metadata_value(
                "ray_cluster_id"
            )

    async def test_handshake_sequence_matches_rays(self, ray_venv: venvs.Venv) -> None:
        """Both clients: GetClusterId without metadata, then the request with the id."""
        cases = [("one", {"num_cpus": 1})]
        async with RecordingGcs() as gcs:
            script = _with(RAY_SEND_SCRIPT, CASES=repr(cases), GCS_ADDRESS=gcs.address)
            await asyncio.to_thread(venvs.run_in_venv, ray_venv, script)
            ray_calls = gcs.calls
            await request_resources_async(num_cpus=1, address=gcs.address)
            our_calls = gcs.calls[len(ray_calls) :]

        def shape(calls: list[Any]) -> list[tuple[str, str | None]]:
            return [(c.method, c.metadata_value("ray_cluster_id")) for c in calls]

        assert shape(our_calls) == shape(ray_calls)
        assert shape(ray_calls) == [
            ("GetClusterId", None),
            ("RequestClusterResourceConstraint", gcs.cluster_id.hex()),
        ]
