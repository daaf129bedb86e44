"""Typed virtual-cluster errors carrying ant-ray's ``StatusCode`` and exact message.

    VcError                     code + message (+ recommendation / failed node ids)
    ├── VcInvalid               code 4   (busy job cluster on remove)
    ├── VcNotFound              code 17
    ├── VcOutOfResource         code 31  (grow/job cluster short of nodes)
    ├── VcInvalidArgument       code 34  (bad request; stale revision; divisibility flip)
    └── VcUnsafeToRemove        code 37  (shrink/remove/remove-nodes refused)
    StalePlan                   a plan was committed onto a registry that moved on

Every VC RPC answers with ``GcsStatus{code, message}`` in its reply, so these never become gRPC
errors; the servicer copies ``code``/``message`` (and the payloads) into the reply.  They are
domain errors (:class:`gcs.base.errors.GcsError`) like every other error below the RPC layer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from gcs.base.errors import GcsError


class VcStatusCode(enum.IntEnum):
    OK = 0
    Invalid = 4
    NotFound = 17
    OutOfResource = 31
    InvalidArgument = 34
    UnsafeToRemove = 37
    """ant-ray-only code. Not documented; the 2.44.1.1 ``_raylet.so`` status-name table lists
    ``UnsafeToRemove`` right after ``ChannelTimeoutError`` (36) with nothing in between, so 37.
    Ant clients only test ``code != 0``."""


class VcError(GcsError):
    code: VcStatusCode = VcStatusCode.Invalid

    def __init__(
        self,
        message: str,
        *,
        replica_sets_to_recommend: Mapping[str, int] | None = None,
        nodes_with_failure: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.replica_sets_to_recommend = dict(replica_sets_to_recommend or {})
        self.nodes_with_failure = list(nodes_with_failure)


class VcInvalid(VcError):
    code = VcStatusCode.Invalid


class VcNotFound(VcError):
    code = VcStatusCode.NotFound


class VcOutOfResource(VcError):
    code = VcStatusCode.OutOfResource


class VcInvalidArgument(VcError):
    code = VcStatusCode.InvalidArgument


class VcUnsafeToRemove(VcError):
    code = VcStatusCode.UnsafeToRemove


class StalePlan(Exception):
    """``commit`` got a plan computed against an older registry generation.

    Mutations must be serialised (plan → persist → commit under one lock); this guards that.
    """
