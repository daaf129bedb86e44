"""Domain errors raised by managers and policy code.  They carry no transport codes.

    GcsError                      base
    ├── InvalidArgument           a request field is bad (the message names it)
    ├── NotFound                  unknown entity
    ├── AlreadyExists
    ├── FailedPrecondition        the state does not allow it, e.g. a dead node re-registering
    ├── Unauthenticated           wrong cluster id / missing or wrong token
    ├── ResourceExhausted         the answer would exceed a limit (reply size)
    ├── Unavailable               store or raylet unreachable; retry later
    │   ├── RayletUnreachable     a raylet did not answer (refused, lost, deadline exceeded)
    │   ├── WorkerUnreachable     a core worker did not answer (its process is likely gone)
    │   ├── StoreUnavailable      the store did not take the write: nothing was written
    │   │   └── StoreFull         ... because it is full (Redis maxmemory, a full disk)
    │   └── StoreOutcomeUnknown   the write may have been applied (resolved later)
    ├── StoreError                base of every store error (the four above and below)
    │   ├── StoreConflict         a compare-and-set condition did not hold; nothing applied
    │   └── StoreCorrupt          stored bytes or schema are not what we wrote
    └── RayStatusError            a refusal a raylet reported by Ray's ``StatusCode`` name

The store errors live in :mod:`gcs.store.errors` (each backend translates its driver's
errors there); they are domain errors like the others, so a manager's caller sees one
family.  How each maps to a gRPC status and to Ray's in-reply ``GcsStatus.code`` is decided
in one place: :mod:`gcs.rpc.errors`.
"""

from __future__ import annotations

import enum


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
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(GcsError):
    pass


class NotFound(GcsError):
    pass


class AlreadyExists(GcsError):
    pass


class FailedPrecondition(GcsError):
    pass


class Unauthenticated(GcsError):
    pass


class ResourceExhausted(GcsError):
    """The answer would exceed a limit (a reply past the message size): ask for less."""


class Unavailable(GcsError):
    pass


class RayletUnreachable(Unavailable):
    """A call to a raylet failed in transport: refused, connection lost or deadline exceeded.

    Raised by the raylet gateway (:mod:`gcs.rpc.raylet_io`); ``node_id`` names the raylet.
    """

    def __init__(self, node_id: bytes, message: str) -> None:
        super().__init__(message)
        self.node_id = node_id


class RayStatusError(GcsError):
    """An error Ray reports with its ``StatusCode`` *name* (e.g. "InvalidArgument").

    Raised by the raylet gateway for a raylet's refusal, and by the servicers of the
    services whose Ray handlers answer this way (AutoscalerStateService, pubsub; see
    :func:`gcs.rpc.errors.as_ray_status`); managers raise the plain errors above.  The
    message follows after a colon so people see it while Ray clients still match the prefix.
    """

    def __init__(self, ray_code: RayStatusCode, message: str) -> None:
        super().__init__(message)
        self.ray_code = ray_code


class WorkerUnreachable(Unavailable):
    """A call to a core worker failed in transport (raised by the actor gateway)."""

    def __init__(self, worker_id: bytes, message: str) -> None:
        super().__init__(message)
        self.worker_id = worker_id
