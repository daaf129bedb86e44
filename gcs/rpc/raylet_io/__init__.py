"""The I/O layer towards raylets, behind :class:`RayletGateway` (managers see nothing else).

    gateway       the protocol managers call, and ``raylet_address``
    grpc_gateway  its network implementation: bounded calls, transport choice, fallback
    pool          raylet clients (HTTP/2 connection + gRPC channel), LRU within a budget
    budget        the budget from config and RLIMIT_NOFILE
    h2_unary      the lean HTTP/2 client for the hot unary call (GetResourceLoad)
    h2_grpc       what a unary gRPC call says in that client's header blocks
    errors        transport failures -> domain errors

A fake for manager tests: :class:`gcs.testing.fake_raylets.FakeRayletGateway`.
"""

from gcs.rpc.raylet_io.gateway import RayletGateway, raylet_address

__all__ = ["RayletGateway", "raylet_address"]
