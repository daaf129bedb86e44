"""Protobuf modules generated from ``protos/gcs/proto`` at build time (never edited by hand).

Our proto package is ``gcs.rpc`` (not Ray's ``ray.rpc``) so these modules load in the same
process as ``ray``; the gRPC method paths we serve and call are still Ray's, see
:mod:`gcs.rpc`.
"""
