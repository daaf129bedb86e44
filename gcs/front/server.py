"""The front server: owns the GCS port, answers the hot pubsub methods itself
(:mod:`.hot`) and every other unary method through grpc.aio's own handler table
(:mod:`.native`), and Ray's syncer stream (:mod:`.sync`); it relays the other streaming
methods and unknown paths to the grpc.aio server (:mod:`.forward`).

Why: at 2,000 long-poll subscribers grpc.aio's per-call machinery alone costs more CPU per
publish than Ray's C++ ``gcs_server`` (``bench/pubsub/floor_server.py``); a held poll here
is a future callback writing one pre-encoded burst.  ``front_server: false`` serves
everything from grpc.aio on the port: a fallback over the same handler objects (the
servicers, :class:`~gcs.services.ray_syncer.StartSync`), never a second implementation; it
loses clearly (about 4x the server CPU per publish at 2,000 subscribers, ~1.8x per load
poll; docs/operations.md).  Every task here runs under a
:class:`~gcs.base.background.Background`, every timer on the injected clock (:mod:`.deadlines`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import grpc
import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock, SystemClock, within
from gcs.config import GcsConfig
from gcs.front.budget import ByteBudget
from gcs.front.deadlines import Deadlines
from gcs.front.forward import Forwarded, Forwarder
from gcs.front.grpc_framing import GrpcWireError, parse_timeout, request_metadata, trailers_only
from gcs.front.h2 import H2Limits, H2ServerConnection, Stream
from gcs.front.hot import HotCall, HotDispatcher, HotMethod
from gcs.front.native import NativeCall, NativeDispatcher, NativeMethod
from gcs.front.reuseport import steer_to_newest
from gcs.front.sync import SyncCall, SyncDispatcher
from gcs.rpc.h2_frames import PROTOCOL_ERROR, REFUSED_STREAM
from gcs.rpc.interceptors import NOT_LEADER_MESSAGE
from gcs.rpc.server import CallHook
from gcs.rpc.warnings import WarningSampler
from gcs.services.ray_syncer import START_SYNC_PATH

if TYPE_CHECKING:  # gcs.server imports this package
    from gcs.rpc.interceptors import CallGuard

log = structlog.get_logger("gcs.front")


def h2_limits(config: GcsConfig) -> H2Limits:
    """The HTTP/2 limits ``config`` sets (``front_*`` and ``http2``)."""
    h2 = config.http2
    return H2Limits(
        max_concurrent_streams=config.front_max_concurrent_streams,
        max_buffered_input=config.front_max_buffered_bytes,
        max_buffered_output=config.front_max_buffered_bytes,
        max_header_block=h2.max_header_list_bytes,
        max_continuations=h2.max_continuations,
        max_settings_entries=h2.max_settings_entries,
        reset_burst=h2.reset_burst,
        reset_rate=h2.reset_rate,
        glitch_burst=h2.glitch_burst,
        glitch_rate=h2.glitch_rate,
        settings_burst=h2.settings_burst,
        settings_rate=h2.settings_rate,
        min_ping_interval_s=h2.min_ping_interval_ms / 1000,
        max_ping_strikes=h2.max_ping_strikes,
        max_outbound_acks=h2.max_outbound_acks,
    )


class GrpcRouter:
    """The :class:`~gcs.front.h2.StreamApp`: checks and routes each request stream."""

    def __init__(
        self,
        hot: Mapping[str, HotMethod],
        native: Mapping[str, NativeMethod],
        guard: CallGuard,
        forwarder: Forwarder,
        *,
        on_call: CallHook | None,
        max_message_bytes: int,
        syncer: SyncDispatcher | None = None,
        warnings: WarningSampler | None = None,
        relayed: Callable[[str], bool] | None = None,
        admit: Callable[[], bool] | None = None,
        clock: Clock | None = None,
        background: Background | None = None,
    ) -> None:
        """``admit`` (``--ha``): False once this GCS may no longer be the leader (its lease
        may have lapsed): each request is then refused UNAVAILABLE and its connection told
        to go away, never answered from stale state."""
        self._admit = admit
        self._parked: list[tuple[H2ServerConnection, Stream]] | None = None
        """While a planned handover runs (:meth:`park`): new requests, held unanswered."""
        self._hot = hot
        self._relayed = relayed
        self._syncer = syncer
        self._native = native
        self._guard = guard
        self._forwarder = forwarder
        clock = clock if clock is not None else SystemClock()
        background = background if background is not None else Background("front")
        self._background = background
        """The front's tasks: native calls, the deadline sleeper."""
        deadlines = Deadlines(clock, background)
        self._dispatcher = HotDispatcher(on_call, max_message_bytes, deadlines, warnings)
        self._natives = NativeDispatcher(
            max_message_bytes, deadlines, background, clock, on_call, warnings
        )

    def on_request(self, conn: H2ServerConnection, stream: Stream) -> None:
        path = authorization = cluster_id = timeout = encoding = None
        for name, value in stream.headers:
            if name == b":path":
                path = value
            elif name == b"authorization":
                authorization = value
            elif name == b"ray_cluster_id":
                cluster_id = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
        if path is None:
            conn.reset(stream, PROTOCOL_ERROR)
            return
        if self._parked is not None:  # a planned handover: the next leader answers it
            self._parked.append((conn, stream))
            return
        if self._admit is not None and not self._admit():
            conn.send_headers(
                stream,
                trailers_only(grpc.StatusCode.UNAVAILABLE, NOT_LEADER_MESSAGE),
                end_stream=True,
            )
            conn.goaway()
            return
        method = path.decode("ascii", "replace")
        try:
            seconds = parse_timeout(timeout) if timeout is not None else None
        except GrpcWireError as err:
            conn.send_headers(stream, trailers_only(err.code, err.message), end_stream=True)
            return
        # checked here for relayed calls too, on the metadata as sent (grpc.aio gets only
        # the entries it can carry; its interceptor checks them again)
        refusal = self._guard.refusal(method, authorization, cluster_id)
        if refusal is not None:
            conn.send_headers(
                stream, trailers_only(grpc.StatusCode.UNAUTHENTICATED, refusal), end_stream=True
            )
            return
        hot = self._hot.get(method)
        native = self._native.get(method) if hot is None else None
        if hot is None and native is None and (self._syncer is None or method != START_SYNC_PATH):
            if self._relayed is not None and not self._relayed(method):
                # answered here: relayed, grpc.aio would end the call before reading the
                # request, and a message written to an ended call can turn its
                # UNIMPLEMENTED into INTERNAL "Internal error from Core" (a race in grpc.aio)
                conn.send_headers(
                    stream,
                    trailers_only(grpc.StatusCode.UNIMPLEMENTED, "Method not found!"),
                    end_stream=True,
                )
                return
            metadata = request_metadata(stream.headers)
            stream.app = self._forwarder.open(conn, stream, method, metadata, seconds, encoding)
            return
        if hot is not None:
            stream.app = HotCall(hot, seconds, encoding)
        elif native is None:
            assert self._syncer is not None
            stream.app = self._syncer.open(conn, stream, encoding)
        else:
            assert native is not None
            stream.app = NativeCall(native, seconds, encoding)

    def on_data(self, conn: H2ServerConnection, stream: Stream, data: bytes) -> None:
        call = stream.app
        if type(call) is HotCall:
            self._dispatcher.on_data(conn, stream, call, data)
        elif type(call) is NativeCall:
            self._natives.on_data(conn, stream, call, data)
        elif type(call) is SyncCall:
            self._syncer.on_data(conn, stream, call, data)  # type: ignore[union-attr]
        elif call is not None:
            self._forwarder.on_data(conn, stream, call, data)

    def on_end(self, conn: H2ServerConnection, stream: Stream) -> None:
        call = stream.app
        if type(call) is HotCall:
            self._dispatcher.on_end(conn, stream, call)
        elif type(call) is NativeCall:
            self._natives.on_end(conn, stream, call)
        elif type(call) is SyncCall:
            self._syncer.on_end(conn, stream, call)  # type: ignore[union-attr]
        elif call is not None:
            self._forwarder.on_end(conn, stream, call)

    def on_reset(self, conn: H2ServerConnection, stream: Stream) -> None:
        call = stream.app
        if type(call) is HotCall:
            self._dispatcher.on_reset(call)
        elif type(call) is NativeCall:
            self._natives.on_reset(call)
        elif type(call) is SyncCall:
            self._syncer.on_reset(call)  # type: ignore[union-attr]
        elif isinstance(call, Forwarded):
            self._forwarder.on_reset(call)

    def park(self) -> None:
        """A planned handover (:mod:`gcs.server.ha_handover`): from now on requests are held,
        unanswered and unread by any handler, until :meth:`refuse_parked`."""
        if self._parked is None:
            self._parked = []

    @property
    def parked(self) -> int:
        """Held requests still open (a client may have cancelled one meanwhile)."""
        return sum(
            1 for conn, stream in self._parked or () if conn.streams.get(stream.id) is stream
        )

    def parked_streams(self) -> set[int]:
        return {id(stream) for _, stream in self._parked or ()}

    def refuse_parked(self) -> int:
        """RST_STREAM REFUSED_STREAM to every held request: no handler saw it, so a gRPC
        client retries it transparently on a new connection (the next leader's).  Later
        requests are refused the same way."""
        parked, self._parked = self._parked or [], []
        for conn, stream in parked:
            conn.reset(stream, REFUSED_STREAM)
        return len(parked)

    def goaway(self) -> None:
        """Shutting down: end the syncer streams (they never end on their own)."""
        if self._syncer is not None:
            self._syncer.end_all()

    async def close(self) -> None:
        """Cancel the native calls still running (their connections are closed)."""
        await self._background.close()


class FrontServer:
    def __init__(
        self,
        router: GrpcRouter,
        forwarder: Forwarder,
        limits: H2Limits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_s: float = 10.0,
        keepalive_timeout_s: float = 20.0,
        budget: ByteBudget | None = None,
        clock: Clock | None = None,
        warnings: WarningSampler | None = None,
    ) -> None:
        self._router = router
        self._keepalive_s = keepalive_s
        self._keepalive_timeout_s = keepalive_timeout_s
        self._background = Background("front-server")
        """The keepalive loop and the connections' timers."""
        self._keepalive: asyncio.Task[None] | None = None
        self._forwarder = forwarder
        self._limits = limits
        self._ssl = ssl_context
        self.budget = budget if budget is not None else ByteBudget(limits.max_buffered_input)
        """Bytes held for all connections together (:mod:`gcs.front.budget`)."""
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._deadlines = Deadlines(self._clock, self._background)
        self._warnings = warnings
        self._server: asyncio.Server | None = None
        self.connections: set[H2ServerConnection] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._processed: dict[H2ServerConnection, int] = {}
        """Per connection, its last stream before a handover held new ones (:meth:`hold`)."""

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen; returns the bound port (an ``OSError`` if it is taken).  ``reuse_port``
        (``--ha``): members of an HA group on one host bind the same port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection,
            host,
            port,
            ssl=self._ssl,
            backlog=4096,
            reuse_address=True,
            reuse_port=reuse_port or None,
        )
        if reuse_port:  # new connections reach us, not a paused ex-leader still bound
            steer_to_newest(self._server.sockets[0])
        self._keepalive = self._background.spawn(self._keepalive_loop(), "keepalive")
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> H2ServerConnection:
        conn = H2ServerConnection(
            self._router,
            self._limits,
            self._closed,
            budget=self.budget,
            clock=self._clock,
            warnings=self._warnings,
            deadlines=self._deadlines,
        )
        self.connections.add(conn)
        self._idle.clear()
        return conn

    def _closed(self, conn: H2ServerConnection) -> None:
        self.connections.discard(conn)
        if not self.connections:
            self._idle.set()

    async def _keepalive_loop(self) -> None:
        clock = self._clock
        while True:
            await clock.sleep(self._keepalive_s)
            now = clock.monotonic_s()
            for conn in list(self.connections):
                conn.keepalive_tick(now, self._keepalive_timeout_s)

    def hold(self) -> None:
        """A planned handover: new requests are held (:meth:`GrpcRouter.park`) and the
        syncer streams end (a raylet reopens its own, which is then held too)."""
        self._router.park()
        self._router.goaway()
        self._processed = {conn: conn.last_stream_id for conn in self.connections}

    @property
    def in_flight(self) -> int:
        """Streams open and not held: calls a handler still works on (or relays)."""
        return sum(len(conn.streams) for conn in self.connections) - self._router.parked

    def in_flight_except(self, paths: frozenset[str]) -> int:
        """:attr:`in_flight` without the calls to ``paths``."""
        return sum(1 for path in self.open_calls() if path not in paths)

    def open_calls(self) -> list[str]:
        """The paths of the calls :attr:`in_flight` counts (for the handover's log)."""
        parked = self._router.parked_streams()
        return [
            dict(stream.headers).get(b":path", b"?").decode("ascii", "replace")
            for conn in self.connections
            for stream in conn.streams.values()
            if id(stream) not in parked
        ]

    def hand_off(self) -> int:
        """The next leader serves: stop listening, refuse what was held (retried there) and
        send GOAWAY on every connection.  Returns how many held requests were refused."""
        if self._server is not None:
            self._server.close()
        processed = self._processed
        for conn in list(self.connections):  # streams after the last processed: retried
            conn.goaway(processed.get(conn, 0))
        return self._router.refuse_parked()

    def goaway(self) -> None:
        """Stop listening and send GOAWAY: clients open no new stream here (a re-poll after
        the publisher answered every held poll would otherwise be held again)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._server is not None:
            self._server.close()
        self._router.goaway()
        for conn in list(self.connections):
            conn.goaway()

    async def stop(self, grace_s: float) -> None:
        """:meth:`goaway`, wait up to ``grace_s`` for open streams, then close.  Held polls
        are answered before (the publisher's close) or reset here."""
        self.goaway()
        try:
            await within(self._clock, grace_s, self._idle.wait())
        except TimeoutError:
            log.info("front.stop_forced", connections=len(self.connections))
        for conn in list(self.connections):
            conn.close()
        await self._router.close()
        await self._forwarder.close()
        await self._background.close()
        if self._server is not None:
            self._server = None
