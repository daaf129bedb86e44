"""Helpers shared by servicers."""

from __future__ import annotations

from gcs.proto import gcs_service_pb2
from gcs.rpc.errors import GcsError, RayStatusCode, ray_code_for


def ok_status() -> gcs_service_pb2.GcsStatus:
    return gcs_service_pb2.GcsStatus(code=RayStatusCode.OK)


def error_status(err: GcsError) -> gcs_service_pb2.GcsStatus:
    """Ray's in-reply status for services that report errors in ``GcsStatus``."""
    return gcs_service_pb2.GcsStatus(code=int(ray_code_for(err)), message=err.message)
