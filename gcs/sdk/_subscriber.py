"""Async long-poll subscriber for the GCS pubsub services (used by raylet agents and the SDK).

Usage::

    sub = GcsSubscriber(channel, on_message=handle, on_publisher_restart=refetch)
    await sub.start()
    await sub.subscribe(GCS_NODE_INFO_CHANNEL)          # all keys; returns once acked
    ...
    await sub.close()

Contract (mirrors Ray's C++ subscriber): messages are delivered in sequence order, each at
most once per publisher; ``max_processed_sequence_id`` acknowledges what was delivered.  A
reply from a *different* publisher id means the GCS restarted (or dropped us for lagging):
the client resets its sequence, resends its subscriptions, then awaits
``on_publisher_restart(new_publisher_id)`` so the owner refetches its snapshots
(subscribe-then-snapshot), then continues polling.  While the GCS is unreachable polls are
retried with exponential backoff.  UNAUTHENTICATED (wrong cluster id) is fatal: the loop
stops and :meth:`wait` raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import grpc
import structlog
from google.protobuf.descriptor import ServiceDescriptor

from gcs.base.pubsub_channels import NIL_PUBLISHER_ID
from gcs.proto import gcs_service_pb2, pubsub_pb2
from gcs.rpc.client import ServiceStub
from gcs.rpc.descriptors import CONTROL_PLANE_PUBSUB

log = structlog.get_logger("gcs.sdk._subscriber")

MessageCallback = Callable[[pubsub_pb2.PubMessage], Awaitable[None] | None]
RestartCallback = Callable[[bytes], Awaitable[None] | None]

FAST_RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
"""Channel options so a restarted GCS is found within seconds (gRPC's default is ~1-120 s)."""


@dataclass(frozen=True)
class SubscriberConfig:
    initial_backoff_s: float = 0.1
    """First retry delay after a failed RPC."""
    max_backoff_s: float = 5.0
    backoff_multiplier: float = 2.0
    poll_timeout_s: float = 660.0
    """Deadline of one long poll; > 2x subscriber_timeout_ms, the longest a poll is held."""
    command_timeout_s: float = 10.0
    """Deadline of one CommandBatch RPC."""
    max_command_batch_size: int = 2000
    """Commands per CommandBatch (Ray's ``max_command_batch_size``)."""


class SubscribeError(Exception):
    """The GCS refused a subscription (e.g. channel not hosted by that service)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


async def _call(cb: Callable[..., object], *args: object) -> None:
    result = cb(*args)
    if inspect.isawaitable(result):
        await result


class GcsSubscriber:
    """One subscriber id on one pubsub service; see the module docstring."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        on_message: MessageCallback,
        on_publisher_restart: RestartCallback | None = None,
        service: ServiceDescriptor = CONTROL_PLANE_PUBSUB,
        subscriber_id: bytes | None = None,
        sender_id: bytes = b"",
        metadata: Iterable[tuple[str, str]] = (),
        config: SubscriberConfig | None = None,
    ) -> None:
        self.subscriber_id = subscriber_id or os.urandom(28)
        self._sender_id = sender_id
        self._stub = ServiceStub(channel, service, metadata=tuple(metadata), timeout_s=None)
        self._on_message = on_message
        self._on_restart = on_publisher_restart
        self._cfg = config or SubscriberConfig()
        self._subscriptions: dict[tuple[int, bytes], None] = {}
        self._publisher_id = b""
        self._max_processed = 0
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._resync = False
        self._restart_pending = False
        self._fatal: grpc.aio.AioRpcError | None = None

    # ---- public API -------------------------------------------------------------------

    @property
    def publisher_id(self) -> bytes:
        """The publisher id last seen (empty before the first reply)."""
        return self._publisher_id

    @property
    def max_processed_sequence_id(self) -> int:
        return self._max_processed

    @property
    def subscriptions(self) -> tuple[tuple[int, bytes], ...]:
        return tuple(self._subscriptions)

    async def start(self) -> None:
        """Start the poll loop (no-op if running)."""
        if self._task is None:
            self._closing = False
            self._task = asyncio.create_task(self._poll_loop(), name="gcs-subscriber")

    async def subscribe(self, channel: int, key_id: bytes | None = None) -> None:
        """Subscribe to one key, or every key of ``channel`` when ``key_id`` is None/empty.

        Returns once the GCS acknowledged it (retrying while it is unreachable); raises
        :class:`SubscribeError` if the GCS rejects it.
        """
        key = (channel, key_id or b"")
        await self._command([key], subscribe=True)
        self._subscriptions[key] = None

    async def unsubscribe(self, channel: int, key_id: bytes | None = None) -> None:
        key = (channel, key_id or b"")
        self._subscriptions.pop(key, None)
        await self._command([key], subscribe=False)

    async def close(self) -> None:
        """Stop polling; safe to call twice.  Server-side state expires by the sweep."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait(self) -> None:
        """Wait for the poll loop to end; raises the fatal RPC error if one stopped it."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)
        if self._fatal is not None:
            raise self._fatal

    async def __aenter__(self) -> GcsSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- commands ---------------------------------------------------------------------

    async def _command(self, keys: list[tuple[int, bytes]], *, subscribe: bool) -> None:
        backoff = self._cfg.initial_backoff_s
        while True:
            try:
                await self._send_commands(keys, subscribe=subscribe)
                return
            except grpc.aio.AioRpcError as err:
                if err.code() not in _RETRYABLE or self._closing:
                    raise SubscribeError(err.code(), err.details() or "") from err
                log.debug("pubsub.command_retry", code=err.code().name)
            await asyncio.sleep(backoff)
            backoff = self._next_backoff(backoff)

    async def _send_commands(self, keys: list[tuple[int, bytes]], *, subscribe: bool) -> None:
        size = self._cfg.max_command_batch_size
        for start in range(0, len(keys), size):
            req = gcs_service_pb2.GcsSubscriberCommandBatchRequest(
                subscriber_id=self.subscriber_id, sender_id=self._sender_id
            )
            for channel, key in keys[start : start + size]:
                cmd = req.commands.add(channel_type=channel, key_id=key)  # type: ignore[arg-type]
                if subscribe:
                    cmd.subscribe_message.SetInParent()
                else:
                    cmd.unsubscribe_message.SetInParent()
            await self._stub.GcsSubscriberCommandBatch(req, timeout=self._cfg.command_timeout_s)

    # ---- poll loop --------------------------------------------------------------------

    def _next_backoff(self, backoff: float) -> float:
        return min(backoff * self._cfg.backoff_multiplier, self._cfg.max_backoff_s)

    async def _poll_loop(self) -> None:
        backoff = self._cfg.initial_backoff_s
        while not self._closing:
            try:
                if self._resync:
                    await self._send_commands(list(self._subscriptions), subscribe=True)
                    self._resync = False
                if self._restart_pending:
                    self._restart_pending = False
                    await self._notify_restart()
                reply = await self._stub.GcsSubscriberPoll(
                    gcs_service_pb2.GcsSubscriberPollRequest(
                        subscriber_id=self.subscriber_id,
                        max_processed_sequence_id=self._max_processed,
                        publisher_id=self._publisher_id or NIL_PUBLISHER_ID,
                    ),
                    timeout=self._cfg.poll_timeout_s,
                )
            except grpc.aio.AioRpcError as err:
                if self._closing:
                    return
                if self._handle_poll_error(err):
                    return
                await asyncio.sleep(backoff)
                backoff = self._next_backoff(backoff)
                continue
            backoff = self._cfg.initial_backoff_s
            await self._handle_reply(reply)

    async def _notify_restart(self) -> None:
        if self._on_restart is None:
            return
        try:
            await _call(self._on_restart, self._publisher_id)
        except Exception:  # the owner's bug must not kill the subscription
            log.exception("pubsub.restart_callback_failed")

    def _handle_poll_error(self, err: grpc.aio.AioRpcError) -> bool:
        """Decide what a failed RPC means; True if the loop must stop."""
        code = err.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            log.error("pubsub.fatal", code=code.name, details=err.details())
            self._fatal = err
            return True
        if code == grpc.StatusCode.ABORTED and (err.details() or "").startswith("NotFound"):
            log.warning("pubsub.dropped_by_publisher", details=err.details())
            self._max_processed = 0
            self._restart_pending = True
        else:
            log.debug("pubsub.poll_retry", code=code.name)
        # The GCS may have restarted or swept us: re-sending subscriptions is idempotent.
        self._resync = bool(self._subscriptions)
        return False

    async def _handle_reply(self, reply: gcs_service_pb2.GcsSubscriberPollReply) -> None:
        pid = reply.publisher_id
        if pid and pid != self._publisher_id:
            restarted = bool(self._publisher_id)
            self._publisher_id = pid
            self._max_processed = 0
            if restarted:
                # Nothing in this reply is acked yet, so the next poll returns it again
                # after we resubscribed and the owner refetched its snapshots.
                log.info("pubsub.publisher_restarted", publisher_id=pid.hex())
                self._resync = bool(self._subscriptions)
                self._restart_pending = True
                return
        for msg in reply.pub_messages:
            if msg.sequence_id <= self._max_processed:
                continue
            try:
                await _call(self._on_message, msg)
            except Exception:  # the owner's bug must not kill the subscription
                log.exception("pubsub.callback_failed", sequence_id=msg.sequence_id)
            self._max_processed = msg.sequence_id
