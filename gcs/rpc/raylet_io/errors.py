"""Raylet call failures (grpc.aio or the lean HTTP/2 client) as domain errors.

A raylet's refusal becomes :class:`~gcs.base.errors.RayStatusError`: a Ray raylet's own status
(gRPC ABORTED, details the StatusCode name, the message as binary error details; an unknown
name is IOError, as Ray's client reads it) or our agent's INVALID_ARGUMENT / NOT_FOUND /
FAILED_PRECONDITION; every other failure means no usable answer arrived and becomes
:class:`~gcs.base.errors.RayletUnreachable`.
"""

from __future__ import annotations

from typing import TypeAlias

import grpc

from gcs.base.errors import GcsError, RayletUnreachable, RayStatusCode, RayStatusError
from gcs.rpc.errors import ray_message
from gcs.rpc.raylet_io.h2_grpc import H2CallError

_REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT: RayStatusCode.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: RayStatusCode.NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: RayStatusCode.Invalid,
}

TransportError: TypeAlias = grpc.aio.AioRpcError | H2CallError


def status_of(err: TransportError) -> tuple[grpc.StatusCode, str]:
    if isinstance(err, H2CallError):
        return err.code(), err.details
    return err.code(), err.details() or ""


def raylet_error(node_id: bytes, method: str, err: TransportError) -> GcsError:
    """``err`` from ``method`` on raylet ``node_id`` as the domain error managers handle."""
    code, details = status_of(err)
    if code is grpc.StatusCode.ABORTED:  # a Ray raylet's own status (RayStatusToGrpcStatus)
        text = ray_message(err) if isinstance(err, grpc.aio.AioRpcError) else details
        named = RayStatusCode.__members__.get(details, RayStatusCode.IOError)
        return RayStatusError(named, f"raylet {node_id.hex()} {method}: {text or code.name}")
    message = f"raylet {node_id.hex()} {method}: {details or code.name}"
    ray_code = _REFUSALS.get(code)
    if ray_code is not None:
        return RayStatusError(ray_code, message)
    return RayletUnreachable(node_id, message)
