"""A raylet's refusal vs. no answer (:func:`gcs.rpc.raylet_io.errors.raylet_error`)."""

from __future__ import annotations

import grpc

from gcs.base.errors import RayletUnreachable, RayStatusCode, RayStatusError
from gcs.rpc.raylet_io.errors import raylet_error

NODE = b"\x07" * 28


def aio_error(code: grpc.StatusCode, details: str, trailers: tuple = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailers), details)


class TestRayletError:
    def test_a_ray_raylets_status_is_its_refusal_with_its_message(self) -> None:
        """Ray's raylet answers a refused Resize as gRPC ABORTED "InvalidArgument" with the
        message as binary error details: a refusal (never "unreachable", which our servicers
        answer UNAVAILABLE and Ray's client retries forever), with the raylet's words."""
        err = aio_error(
            grpc.StatusCode.ABORTED,
            "InvalidArgument",
            (("grpc-status-details-bin", b"Cannot resize GPU"),),
        )
        out = raylet_error(NODE, "ResizeLocalResourceInstances", err)
        assert isinstance(out, RayStatusError)
        assert out.ray_code is RayStatusCode.InvalidArgument
        assert out.message.endswith("InvalidArgument: Cannot resize GPU")

    def test_an_unknown_code_name_is_ioerror_as_rays_client_reads_it(self) -> None:
        out = raylet_error(NODE, "DrainRaylet", aio_error(grpc.StatusCode.ABORTED, "Bogus"))
        assert isinstance(out, RayStatusError) and out.ray_code is RayStatusCode.IOError

    def test_no_answer_is_unreachable(self) -> None:
        out = raylet_error(NODE, "DrainRaylet", aio_error(grpc.StatusCode.UNAVAILABLE, "refused"))
        assert isinstance(out, RayletUnreachable)
