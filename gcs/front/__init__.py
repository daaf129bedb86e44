"""The front server on the GCS port: a lean HTTP/2 server answering the hot pubsub methods
and every other unary method itself, relaying streams to grpc.aio (see
:mod:`gcs.front.server`)."""

from gcs.front.budget import ByteBudget
from gcs.front.forward import Forwarder
from gcs.front.h2 import H2Limits
from gcs.front.hot import hot_methods
from gcs.front.native import native_methods, serves
from gcs.front.server import FrontServer, GrpcRouter, h2_limits

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
