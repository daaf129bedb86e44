"""Errors raised by the SDK.

    GcsSdkError                 root: catch this to catch everything below
    ├── AddressNotFound         no address given and none in GCS_ADDRESS / RAY_ADDRESS
    └── RpcError                a call failed on the wire; ``.status`` is the gRPC code

Argument validation in :func:`gcs.sdk.request_resources` raises ``TypeError`` /
``ValueError`` with Ray's own messages instead, so code written against
``ray.autoscaler.sdk.request_resources`` keeps catching what it caught.
"""

from __future__ import annotations

import grpc


class GcsSdkError(Exception):
    """Root of every error the SDK raises on its own account."""


class AddressNotFound(GcsSdkError):
    """No GCS address: pass ``address=`` or set ``GCS_ADDRESS`` / ``RAY_ADDRESS``."""


class RpcError(GcsSdkError):
    """A gRPC call failed.  ``status`` is the :class:`grpc.StatusCode`, ``details`` its text."""

    def __init__(self, method: str, status: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} failed with {status.name}: {details}")
        self.method = method
        self.status = status
        self.details = details

    @classmethod
    def from_grpc(cls, method: str, err: grpc.RpcError) -> RpcError:
        from gcs.rpc.errors import ray_message  # a Ray-style status's message too

        code = err.code() if hasattr(err, "code") else None
        return cls(method, code or grpc.StatusCode.UNKNOWN, ray_message(err))
