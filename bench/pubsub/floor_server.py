"""The cheapest grpc.aio server that can play the pubsub harness: the floor for ours.

    python bench/pubsub/floor_server.py PORT

No publisher, no store, no interceptor, no metrics: ``RegisterNode`` turns the request into
one shared reply and resolves one future every held ``GcsSubscriberPoll`` awaits; a poll
that has not acked the latest message gets it at once.  Raw bytes in and out.  Whatever
CPU this costs per publish is gRPC's (grpc.aio + C-core + kernel) and cannot be removed by
any change to our pubsub code; ``vs_ray.py --servers ours,floor,ray`` shows it in the same
run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import grpc

from gcs.base.protowire import varint
from gcs.proto import gcs_service_pb2, pubsub_pb2
from gcs.rpc.server import LONG_POLL_SERVER_OPTIONS

_PID = b"F" * 28
_TAIL = b"\x12\x1c" + _PID + b"\xa2\x06\x00"
_NODE_CHANNEL = pubsub_pb2.ChannelType.Value("GCS_NODE_INFO_CHANNEL")


class Floor:
    def __init__(self) -> None:
        self.seq = 0
        self.reply = _TAIL
        self.next: asyncio.Future[bytes] | None = None

    async def poll(self, raw: bytes, context: object) -> bytes:
        req = gcs_service_pb2.GcsSubscriberPollRequest.FromString(raw)
        if self.seq and req.max_processed_sequence_id < self.seq:
            return self.reply
        if self.next is None or self.next.done():
            self.next = asyncio.get_running_loop().create_future()
        return await self.next

    async def register(self, raw: bytes, context: object) -> bytes:
        req = gcs_service_pb2.RegisterNodeRequest.FromString(raw)
        self.seq += 1
        msg = pubsub_pb2.PubMessage(
            channel_type=_NODE_CHANNEL, key_id=req.node_info.node_id, sequence_id=self.seq
        )
        msg.node_info_message.CopyFrom(req.node_info)
        data = msg.SerializeToString()
        self.reply = b"\x0a" + varint(len(data)) + data + _TAIL
        if self.next is not None and not self.next.done():
            self.next.set_result(self.reply)
        return b""

    async def empty(self, raw: bytes, context: object) -> bytes:
        return b""

    async def cluster_id(self, raw: bytes, context: object) -> bytes:
        return gcs_service_pb2.GetClusterIdReply(cluster_id=b"c" * 28).SerializeToString()


def _handler(fn: object) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(fn)  # type: ignore[arg-type]


async def main(port: int) -> None:
    floor = Floor()
    options: list[tuple[str, int | str]] = list(LONG_POLL_SERVER_OPTIONS)
    for item in filter(None, os.environ.get("FLOOR_SERVER_OPTIONS", "").split(",")):
        key, _, value = item.partition("=")  # e.g. grpc.http2.bdp_probe=0
        options.append((key, int(value) if value.lstrip("-").isdigit() else value))
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "ray.rpc.ControlPlanePubSubGcsService",
                {
                    "GcsSubscriberPoll": _handler(floor.poll),
                    "GcsSubscriberCommandBatch": _handler(floor.empty),
                },
            ),
            grpc.method_handlers_generic_handler(
                "ray.rpc.NodeInfoGcsService",
                {
                    "RegisterNode": _handler(floor.register),
                    "GetClusterId": _handler(floor.cluster_id),
                },
            ),
        ]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=None)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
