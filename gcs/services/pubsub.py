"""Servicers for ``ray.rpc.ControlPlanePubSubGcsService`` and ``ObservabilityPubSubService``.

Thin: decode the request, call the :class:`~gcs.managers.pubsub.publisher.Publisher`, encode.
Validation and the publisher raise plain domain errors; this servicer answers them as Ray's
pubsub handlers do, gRPC ABORTED "<StatusCode name>: ..." (:func:`gcs.rpc.errors.as_ray_status`).
Cluster-id metadata is checked by the server interceptor.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from gcs.base.errors import GcsError, InvalidArgument
from gcs.base.pubsub_channels import RAY_ERROR_INFO_CHANNEL
from gcs.config import RequestLimits
from gcs.managers.pubsub.publisher import PollReply, Publisher
from gcs.proto import gcs_service_pb2
from gcs.rpc.errors import as_ray_status
from gcs.services import validate


class PubSubServicer:
    """GcsPublish, GcsSubscriberPoll and GcsSubscriberCommandBatch over one publisher."""

    def __init__(self, publisher: Publisher, *, limits: RequestLimits | None = None) -> None:
        self.publisher = publisher
        self._limits = limits or RequestLimits()

    def _ids(self, field: str, *values: bytes) -> None:
        """Subscriber, sender and publisher ids (Ray's are 28 bytes) are bounded."""
        for value in values:
            validate.blob(value, field, self._limits.max_id_bytes)

    async def GcsPublish(
        self, request: gcs_service_pb2.GcsPublishRequest, context: grpc.aio.ServicerContext
    ) -> gcs_service_pb2.GcsPublishReply:
        return self.publish(request)

    def publish(
        self, request: gcs_service_pb2.GcsPublishRequest
    ) -> gcs_service_pb2.GcsPublishReply:
        """GcsPublish without a context (also called by the front server, gcs.front)."""
        try:
            self._check_publish(request)  # all or nothing: every check before any publish
            for msg in request.pub_messages:
                self.publisher.publish_message(msg)
        except GcsError as err:
            raise as_ray_status(err) from None
        return _ok(gcs_service_pb2.GcsPublishReply())

    def _check_publish(self, request: gcs_service_pb2.GcsPublishRequest) -> None:
        """Size limits and hosted channels, each error naming the field (Ray's status style)."""
        cfg = self.publisher.config
        lim = self._limits
        validate.entries(request.pub_messages, "pub_messages", lim.max_repeated_entries)
        total = request.ByteSize()
        if total > cfg.max_publish_request_bytes:
            raise InvalidArgument(
                f"GcsPublishRequest is {total} bytes; the limit is "
                f"{cfg.max_publish_request_bytes} (max_publish_request_bytes)",
            )
        for i, msg in enumerate(request.pub_messages):
            self.publisher.check_channel(msg.channel_type)
            validate.blob(msg.key_id, f"pub_messages[{i}].key_id", lim.max_name_bytes)
            size = msg.ByteSize()
            if size > cfg.max_message_bytes:
                raise InvalidArgument(
                    f"GcsPublishRequest.pub_messages[{i}] is {size} bytes; the limit is "
                    f"{cfg.max_message_bytes} (max_message_bytes)",
                )

    async def GcsSubscriberPoll(
        self, request: gcs_service_pb2.GcsSubscriberPollRequest, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Long poll; the reply is ready wire bytes, often shared by every subscriber."""
        future = self.poll(request)
        return (await future).wire  # a cancelled RPC cancels the future; messages stay queued

    def poll(self, request: gcs_service_pb2.GcsSubscriberPollRequest) -> asyncio.Future[PollReply]:
        """Validate and register the long poll; the future resolves with its reply."""
        try:
            self._ids("subscriber_id", request.subscriber_id)
            self._ids("publisher_id", request.publisher_id)
            return self.publisher.poll(
                request.subscriber_id, request.max_processed_sequence_id, request.publisher_id
            )
        except GcsError as err:
            raise as_ray_status(err) from None

    async def GcsSubscriberCommandBatch(
        self,
        request: gcs_service_pb2.GcsSubscriberCommandBatchRequest,
        context: grpc.aio.ServicerContext,
    ) -> gcs_service_pb2.GcsSubscriberCommandBatchReply:
        return self.command_batch(request)

    def command_batch(
        self, request: gcs_service_pb2.GcsSubscriberCommandBatchRequest
    ) -> gcs_service_pb2.GcsSubscriberCommandBatchReply:
        """GcsSubscriberCommandBatch without a context (also the front server's)."""
        try:
            self._check_commands(request)  # validate the whole batch first
        except GcsError as err:
            raise as_ray_status(err) from None
        sub_id = request.subscriber_id
        sender = request.sender_id or sub_id
        for cmd in request.commands:
            if cmd.HasField("subscribe_message"):
                self.publisher.subscribe(sub_id, cmd.channel_type, cmd.key_id, sender)
            else:
                self.publisher.unsubscribe(sub_id, cmd.channel_type, cmd.key_id)
        return _ok(gcs_service_pb2.GcsSubscriberCommandBatchReply())

    def _check_commands(self, request: gcs_service_pb2.GcsSubscriberCommandBatchRequest) -> None:
        self._ids("subscriber_id", request.subscriber_id)
        self._ids("sender_id", request.sender_id)
        lim = self._limits
        validate.entries(request.commands, "commands", lim.max_repeated_entries)
        for i, cmd in enumerate(request.commands):
            if cmd.WhichOneof("command_message_one_of") is None:
                raise InvalidArgument("command is neither subscribe nor unsubscribe")
            self.publisher.check_channel(cmd.channel_type)
            validate.blob(cmd.key_id, f"commands[{i}].key_id", lim.max_name_bytes)


class ObservabilityPubSubServicer(PubSubServicer):
    """Adds ``ReportJobError``: publish the error on RAY_ERROR_INFO keyed by job id hex."""

    async def ReportJobError(
        self, request: gcs_service_pb2.ReportJobErrorRequest, context: grpc.aio.ServicerContext
    ) -> gcs_service_pb2.ReportJobErrorReply:
        error = request.job_error
        try:
            self._ids("job_error.job_id", error.job_id)
            validate.strings_in(error, "job_error", self._limits.max_text_bytes)
        except GcsError as err:
            raise as_ray_status(err) from None
        self.publisher.publish(RAY_ERROR_INFO_CHANNEL, error.job_id.hex().encode(), error)
        return gcs_service_pb2.ReportJobErrorReply()


def _ok(reply: Any) -> Any:
    reply.status.SetInParent()  # Ray sets an (empty) OK GcsStatus on every pubsub reply
    return reply
