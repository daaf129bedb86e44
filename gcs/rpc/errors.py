"""The one table from domain errors (:mod:`gcs.errors`, store errors included) to gRPC
statuses and Ray's in-reply status codes.

Servicers never let an exception escape as gRPC UNKNOWN: Ray's C++ client retries UNKNOWN
silently, which looks like a hang to users.  Anything not in the table becomes INTERNAL
(and the wrapper logs it).

The domain error classes are re-exported here for older import sites.
"""

from __future__ import annotations

from collections.abc import Callable

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
from gcs.store.errors import (
    StoreConflict,
    StoreError,
    StoreFenced,
    StoreFull,
    StoreOutcomeUnknown,
    StoreUnavailable,
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
    "as_ray_status",
    "grpc_details",
    "ray_code_for",
    "status_for",
]

Details = Callable[[GcsError], str]


def _message(err: GcsError) -> str:
    return err.message


def _prefixed(prefix: str) -> Details:
    return lambda err: f"{prefix}: {err.message}"


def _ray_style(err: GcsError) -> str:
    code = err.ray_code if isinstance(err, RayStatusError) else RayStatusCode.UnknownError
    return f"{code.name}: {err.message}" if err.message else code.name


# Most specific first: the first isinstance match wins.  Store rows keep what a client may
# conclude apart: "nothing was written" (retry is safe) vs "may have been applied".
_TABLE: tuple[tuple[type[GcsError], grpc.StatusCode, RayStatusCode, Details], ...] = (
    (RayStatusError, grpc.StatusCode.ABORTED, RayStatusCode.UnknownError, _ray_style),
    (
        StoreOutcomeUnknown,
        grpc.StatusCode.UNAVAILABLE,
        RayStatusCode.IOError,
        _prefixed("store unavailable; the write may have been applied, retry to learn"),
    ),
    (
        StoreFenced,
        grpc.StatusCode.UNAVAILABLE,
        RayStatusCode.IOError,
        _prefixed("this GCS is no longer the leader, nothing was written"),
    ),
    (
        StoreFull,
        grpc.StatusCode.UNAVAILABLE,
        RayStatusCode.IOError,
        _prefixed("store full, nothing was written"),
    ),
    (
        StoreUnavailable,
        grpc.StatusCode.UNAVAILABLE,
        RayStatusCode.IOError,
        _prefixed("store unavailable, nothing was written"),
    ),
    (
        StoreConflict,
        grpc.StatusCode.ABORTED,
        RayStatusCode.UnknownError,
        _prefixed("concurrent update, retry"),
    ),
    (StoreError, grpc.StatusCode.INTERNAL, RayStatusCode.UnknownError, _prefixed("store error")),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, RayStatusCode.InvalidArgument, _message),
    (NotFound, grpc.StatusCode.NOT_FOUND, RayStatusCode.NotFound, _message),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS, RayStatusCode.AlreadyExists, _message),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, RayStatusCode.Invalid, _message),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, RayStatusCode.AuthError, _message),
    (
        ResourceExhausted,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        RayStatusCode.OutOfResource,
        _message,
    ),
    (Unavailable, grpc.StatusCode.UNAVAILABLE, RayStatusCode.IOError, _message),
)
_INTERNAL = (grpc.StatusCode.INTERNAL, RayStatusCode.UnknownError, _message)


def _row(err: GcsError) -> tuple[grpc.StatusCode, RayStatusCode, Details]:
    for cls, code, ray_code, details in _TABLE:
        if isinstance(err, cls):
            return code, ray_code, details
    return _INTERNAL


def ray_code_for(err: GcsError) -> RayStatusCode:
    """Ray's ``GcsStatus.code`` for services that report errors inside the reply."""
    if isinstance(err, RayStatusError):
        return err.ray_code
    return _row(err)[1]


def as_ray_status(err: GcsError) -> RayStatusError:
    """``err`` the way Ray's AutoscalerStateService and pubsub handlers answer it: gRPC
    ABORTED with details "<StatusCode name>: message" (servicers of those services call
    this; managers raise the plain domain error)."""
    if isinstance(err, RayStatusError):
        return err
    return RayStatusError(ray_code_for(err), err.message)


def grpc_details(err: GcsError) -> str:
    return _row(err)[2](err)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status for ``exc``, or None when it is not ours (the caller answers INTERNAL)."""
    if not isinstance(exc, GcsError):
        return None
    code, _, details = _row(exc)
    return code, details(exc)
