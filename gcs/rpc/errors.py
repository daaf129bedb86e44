"""Domain errors raised by managers, and the one table that maps them to gRPC statuses.

    GcsError                      base; carries a Ray StatusCode for replies with GcsStatus
    ├── InvalidArgument           bad request field (INVALID_ARGUMENT, Ray "InvalidArgument")
    ├── NotFound                  unknown entity (NOT_FOUND, Ray "NotFound")
    ├── AlreadyExists             (ALREADY_EXISTS)
    ├── FailedPrecondition        state does not allow it, e.g. stale revision
    ├── Unauthenticated           wrong cluster id metadata
    └── Unavailable               store or raylet unreachable; nothing was acknowledged

Servicers never let another exception escape as gRPC UNKNOWN: Ray's C++ client retries
UNKNOWN silently, which looks like a hang to users (reference gcs-server.md §1).
"""

from __future__ import annotations

import enum

import grpc


class RayStatusCode(enum.IntEnum):
    """Ray's ``StatusCode`` numbers, as they appear in ``GcsStatus.code``."""

    OK = 0
    OutOfMemory = 1
    KeyError = 2
    TypeError = 3
    Invalid = 4
    IOError = 5
    UnknownError = 9
    NotImplemented = 10
    RedisError = 11
    TimedOut = 12
    Interrupted = 13
    IntentionalSystemExit = 14
    UnexpectedSystemExit = 15
    CreationTaskError = 16
    NotFound = 17
    Disconnected = 18
    SchedulingCancelled = 19
    AlreadyExists = 20
    ObjectExists = 21
    ObjectNotFound = 22
    ObjectAlreadySealed = 23
    ObjectStoreFull = 24
    TransientObjectStoreFull = 25
    OutOfDisk = 28
    ObjectUnknownOwner = 29
    RpcError = 30
    OutOfResource = 31
    ObjectRefEndOfStream = 32
    AuthError = 33
    InvalidArgument = 34
    ChannelError = 35
    ChannelTimeoutError = 36
    PermissionDenied = 37


class GcsError(Exception):
    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    ray_code: RayStatusCode = RayStatusCode.UnknownError

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(GcsError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    ray_code = RayStatusCode.InvalidArgument


class NotFound(GcsError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    ray_code = RayStatusCode.NotFound


class AlreadyExists(GcsError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    ray_code = RayStatusCode.AlreadyExists


class FailedPrecondition(GcsError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    ray_code = RayStatusCode.Invalid


class Unauthenticated(GcsError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    ray_code = RayStatusCode.AuthError


class Unavailable(GcsError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    ray_code = RayStatusCode.IOError


class RayStatusError(GcsError):
    """An error Ray reports as gRPC ABORTED with the Ray code *name* as details.

    Ray's AutoscalerStateService does this (e.g. ABORTED "InvalidArgument"); we add the human
    message after a colon so people see it while Ray clients still match the prefix.
    """

    grpc_code = grpc.StatusCode.ABORTED

    def __init__(self, ray_code: RayStatusCode, message: str) -> None:
        super().__init__(message)
        self.ray_code = ray_code


def grpc_details(err: GcsError) -> str:
    if isinstance(err, RayStatusError):
        return f"{err.ray_code.name}: {err.message}" if err.message else err.ray_code.name
    return err.message


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The one table from our exceptions to gRPC statuses (None: not ours -> INTERNAL)."""
    from gcs.store.errors import StoreConflict, StoreError, StoreUnavailable

    if isinstance(exc, GcsError):
        return exc.grpc_code, grpc_details(exc)
    if isinstance(exc, StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE, f"store unavailable, nothing was written: {exc}"
    if isinstance(exc, StoreConflict):
        return grpc.StatusCode.ABORTED, f"concurrent update, retry: {exc}"
    if isinstance(exc, StoreError):
        return grpc.StatusCode.INTERNAL, f"store error: {exc}"
    return None
