"""The front server on the GCS port: a lean HTTP/2 server for the hot pubsub methods that
relays every other stream to grpc.aio (see :mod:`gcs.rpc.front.server`)."""

from gcs.rpc.front.forward import Forwarder
from gcs.rpc.front.h2 import H2Limits
from gcs.rpc.front.hot import hot_methods
from gcs.rpc.front.server import FrontServer, GrpcRouter

__all__ = ["Forwarder", "FrontServer", "GrpcRouter", "H2Limits", "hot_methods"]
