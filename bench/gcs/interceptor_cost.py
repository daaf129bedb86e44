"""Server CPU per RPC added by the call-guard interceptor (cluster id + token check).

A grpc.aio server in this process serves a trivial unary method under several interceptor
set-ups; a client in another process sends N calls (C concurrent) carrying Ray's metadata
(``ray_cluster_id`` and ``authorization: Bearer ...``).  We report this process's CPU per
RPC and the difference to the no-interceptor baseline measured in the same run.

    python -m bench.gcs.interceptor_cost [--calls 8000] [--concurrency 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

import grpc

from gcs.base.auth import AuthToken
from gcs.rpc.interceptors import WRONG_CLUSTER_ID, CallGuardInterceptor

CLUSTER = "ab" * 28
TOKEN = AuthToken("0123456789abcdef0123456789abcdef", "bench")
METHOD = "/bench.Echo/Call"
SYNC_GUARD = CallGuardInterceptor(None, None)  # marker: use _SyncGuard instead


class LegacyClusterIdInterceptor(grpc.aio.ServerInterceptor):
    """The interceptor before issue 12 (cluster id only), kept here as the 'before' figure."""

    def __init__(self, cluster_id_hex: str) -> None:
        self._expected = cluster_id_hex

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        for key, value in handler_call_details.invocation_metadata or ():  # type: ignore[attr-defined]
            if key == "ray_cluster_id":
                text = value.decode() if isinstance(value, bytes) else value
                if text.lower() != self._expected:

                    async def abort(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                        await context.abort(grpc.StatusCode.UNAUTHENTICATED, WRONG_CLUSTER_ID)
                        return b""

                    return grpc.unary_unary_rpc_method_handler(abort)
                break
        return await continuation(handler_call_details)


VARIANTS: dict[str, Callable[[], list[grpc.aio.ServerInterceptor]]] = {
    "none": list,
    "before: cluster-id only": lambda: [LegacyClusterIdInterceptor(CLUSTER)],
    "after: auth disabled": lambda: [CallGuardInterceptor(CLUSTER, None)],
    "after: token mode": lambda: [CallGuardInterceptor(CLUSTER, TOKEN)],
    "two interceptors (token separate)": lambda: [
        CallGuardInterceptor(CLUSTER, None),
        CallGuardInterceptor(None, TOKEN),
    ],
    "token mode, sync generic-handler guard": lambda: [SYNC_GUARD],
}


class _SyncGuard(grpc.GenericRpcHandler):
    """The same checks done synchronously in a generic handler (no interceptor coroutine)."""

    def __init__(self, inner: grpc.GenericRpcHandler, guard: CallGuardInterceptor) -> None:
        self._inner = inner
        self._token = TOKEN
        self._reject = guard._unauthenticated

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        ok = False
        for key, value in details.invocation_metadata or ():  # type: ignore[attr-defined]
            if key == "authorization":
                ok = self._token.matches(value)
            elif key == "ray_cluster_id" and value.lower() != CLUSTER:
                return self._reject
        return self._inner.service(details) if ok else self._reject


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def serve_and_measure(interceptors: list[grpc.aio.ServerInterceptor], calls: int, conc: int):
    sync_guard = interceptors == [SYNC_GUARD]
    server = grpc.aio.server(interceptors=[] if sync_guard else interceptors)
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    if sync_guard:
        handler = _SyncGuard(handler, CallGuardInterceptor(CLUSTER, TOKEN))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.gcs.interceptor_cost", "--client", str(port),
            "--calls", str(calls), "--concurrency", str(conc),
        )  # fmt: skip
        if await proc.wait() != 0:
            raise RuntimeError("client failed")
        return (time.process_time() - cpu0) / calls * 1e6, time.perf_counter() - wall0
    finally:
        await server.stop(None)


async def client(port: int, calls: int, conc: int) -> None:
    metadata = (("ray_cluster_id", CLUSTER), *TOKEN.metadata())
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD)
        for _ in range(50):  # warm up the connection
            await call(b"x", metadata=metadata)
        per_worker = calls // conc

        async def worker() -> None:
            for _ in range(per_worker):
                await call(b"x", metadata=metadata)

        await asyncio.gather(*(worker() for _ in range(conc)))


async def main(calls: int, conc: int, repeats: int) -> None:
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, make in VARIANTS.items():  # interleaved: load drifts hit every variant
            us, _wall = await serve_and_measure(make(), calls, conc)
            results[name].append(us)
    base = min(results["none"])
    print(f"server CPU per RPC, {calls} calls x {repeats} (best of), concurrency {conc}")
    for name, values in results.items():
        best = min(values)
        extra = best - base
        print(f"  {name:36s} {best:7.1f} us/RPC  +{extra:6.1f} us vs none  ({best / base:.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--client", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(client(args.client, args.calls, args.concurrency))
    else:
        asyncio.run(main(args.calls, args.concurrency, args.repeats))
