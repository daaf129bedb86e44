"""The one table from domain errors (:mod:`gcs.base.errors`, store errors included) to gRPC
statuses and Ray's in-reply status codes.

Servicers never let an exception escape as gRPC UNKNOWN: Ray's C++ client retries UNKNOWN
silently, which looks like a hang to users.  Anything not in the table becomes INTERNAL
(and the wrapper logs it).

A :class:`RayStatusError` goes out as Ray's own handlers send a non-OK Ray status
(``RayStatusToGrpcStatus``): gRPC ABORTED, details = the StatusCode *name* alone
("Invalid"), and the human message as the status's binary error details (trailer
``grpc-status-details-bin``, :func:`trailers_for`).  Ray 2.60's client turns that back
into the Ray status: the code from the name (an unknown name is IOError) and the message
from the error details, so ``"Invalid: msg"`` in the details reached Python as a bare
``OSError()``.  :func:`ray_message` reads such an answer back on our side.

The domain error classes are re-exported here for older import sites.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from gcs.base.errors import (
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
    "RAY_STATUS_DETAILS_KEY",
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
    "ray_message",
    "status_for",
    "trailers_for",
]

RAY_STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The trailer carrying a gRPC status's binary error details (a Ray status's message)."""

Details = Callable[[GcsError], str]


def _message(err: GcsError) -> str:
    return err.message


def _prefixed(prefix: str) -> Details:
    return lambda err: f"{prefix}: {err.message}"


def _ray_style(err: GcsError) -> str:
    """The code name alone: Ray's client parses the whole details string as a code name."""
    code = err.ray_code if isinstance(err, RayStatusError) else RayStatusCode.UnknownError
    return code.name


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
    ABORTED with details "<StatusCode name>" and the message in the error-details trailer
    (servicers of those services call this; managers raise the plain domain error)."""
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


def trailers_for(exc: BaseException) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata a failed call answers with besides its status: a Ray-style
    status's message as the binary error details (empty for everything else)."""
    if isinstance(exc, RayStatusError) and exc.message:
        return ((RAY_STATUS_DETAILS_KEY, exc.message.encode()),)
    return ()


def ray_message(err: grpc.RpcError) -> str:
    """What a client shows for a failed call: its details, and for a Ray-style status
    (ABORTED "<code name>") the message from the error-details trailer after a colon."""
    details = err.details() if hasattr(err, "details") else ""  # type: ignore[attr-defined]
    details = details or ""
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None  # type: ignore[attr-defined]
    for key, value in trailing or ():
        if key == RAY_STATUS_DETAILS_KEY and value:
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            return f"{details}: {text}" if details else text
    return details
