"""The one table from domain errors (:mod:`gcs.errors`) and store errors to gRPC statuses.

Servicers never let an exception escape as gRPC UNKNOWN: Ray's C++ client retries UNKNOWN
silently, which looks like a hang to users (reference gcs-server.md §1).  Anything not in
the table becomes INTERNAL (and the wrapper logs it).

The domain error classes are re-exported here for older import sites.
"""

from __future__ import annotations

import grpc

from gcs.errors import (
    AlreadyExists,
    FailedPrecondition,
    GcsError,
    InvalidArgument,
    NotFound,
    RayStatusCode,
    RayStatusError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "AlreadyExists",
    "FailedPrecondition",
    "GcsError",
    "InvalidArgument",
    "NotFound",
    "RayStatusCode",
    "RayStatusError",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "grpc_details",
    "ray_code_for",
    "status_for",
]

# Most specific first: the first isinstance match wins.
_TABLE: tuple[tuple[type[GcsError], grpc.StatusCode, RayStatusCode], ...] = (
    (RayStatusError, grpc.StatusCode.ABORTED, RayStatusCode.UnknownError),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, RayStatusCode.InvalidArgument),
    (NotFound, grpc.StatusCode.NOT_FOUND, RayStatusCode.NotFound),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS, RayStatusCode.AlreadyExists),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, RayStatusCode.Invalid),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, RayStatusCode.AuthError),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED, RayStatusCode.OutOfResource),
    (Unavailable, grpc.StatusCode.UNAVAILABLE, RayStatusCode.IOError),
)


def _row(err: GcsError) -> tuple[grpc.StatusCode, RayStatusCode]:
    for cls, code, ray_code in _TABLE:
        if isinstance(err, cls):
            return code, ray_code
    return grpc.StatusCode.INTERNAL, RayStatusCode.UnknownError


def ray_code_for(err: GcsError) -> RayStatusCode:
    """Ray's ``GcsStatus.code`` for services that report errors inside the reply."""
    if isinstance(err, RayStatusError):
        return err.ray_code
    return _row(err)[1]


def grpc_details(err: GcsError) -> str:
    if isinstance(err, RayStatusError):
        return f"{err.ray_code.name}: {err.message}" if err.message else err.ray_code.name
    return err.message


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status for ``exc``, or None when it is not ours (the caller answers INTERNAL)."""
    from gcs.store.errors import StoreConflict, StoreError, StoreOutcomeUnknown, StoreUnavailable

    if isinstance(exc, GcsError):
        return _row(exc)[0], grpc_details(exc)
    if isinstance(exc, StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE, f"store unavailable, nothing was written: {exc}"
    if isinstance(exc, StoreOutcomeUnknown):
        return (
            grpc.StatusCode.UNAVAILABLE,
            f"store unavailable; the write may have been applied, retry to learn: {exc}",
        )
    if isinstance(exc, StoreConflict):
        return grpc.StatusCode.ABORTED, f"concurrent update, retry: {exc}"
    if isinstance(exc, StoreError):
        return grpc.StatusCode.INTERNAL, f"store error: {exc}"
    return None
