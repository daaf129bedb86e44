"""gRPC plumbing: Ray's method paths, servicer wrapping, client stubs, error mapping."""

from gcs.rpc.client import ServiceStub
from gcs.rpc.errors import (
    AlreadyExists,
    FailedPrecondition,
    GcsError,
    InvalidArgument,
    NotFound,
    RayStatusCode,
    RayStatusError,
    Unauthenticated,
    Unavailable,
)
from gcs.rpc.method_paths import method_path, wire_service_name
from gcs.rpc.server import service_handler

__all__ = [
    "AlreadyExists",
    "FailedPrecondition",
    "GcsError",
    "InvalidArgument",
    "NotFound",
    "RayStatusCode",
    "RayStatusError",
    "ServiceStub",
    "Unauthenticated",
    "Unavailable",
    "method_path",
    "service_handler",
    "wire_service_name",
]
