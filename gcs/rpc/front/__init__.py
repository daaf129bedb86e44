"""The front server on the GCS port: a lean HTTP/2 server answering the hot pubsub methods
and every other unary method itself, relaying streams to grpc.aio (see
:mod:`gcs.rpc.front.server`)."""

from gcs.rpc.front.budget import ByteBudget
from gcs.rpc.front.forward import Forwarder
from gcs.rpc.front.h2 import H2Limits
from gcs.rpc.front.hot import hot_methods
from gcs.rpc.front.native import native_methods, serves
from gcs.rpc.front.server import FrontServer, GrpcRouter, h2_limits

__all__ = [
    "ByteBudget",
    "Forwarder",
    "FrontServer",
    "GrpcRouter",
    "H2Limits",
    "h2_limits",
    "hot_methods",
    "native_methods",
    "serves",
]
