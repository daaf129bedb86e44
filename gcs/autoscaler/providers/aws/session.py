"""The EC2 client and the one way its calls run.

boto3 blocks: every call runs in a worker thread (``asyncio.to_thread``), never on the event
loop.  botocore's own retries are off (they sleep on wall time); throttling
(``RequestLimitExceeded``) is retried here with exponential backoff on the injected clock,
and a call still throttled after the last try raises like any other.  The endpoint is
boto3's: ``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL`` when set.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

import structlog

from gcs.autoscaler.config import ConfigError
from gcs.autoscaler.providers.aws.errors import THROTTLE_CODES, code_of
from gcs.base.clock import Clock

__all__ = ["Ec2", "make_client"]

log = structlog.get_logger("gcs.autoscaler.providers")


def make_client(region: str, credentials: Mapping[str, str]) -> Any:
    """An EC2 client for ``region`` (``credentials``: ``aws_credentials`` of the section,
    else boto3's default chain); botocore's wall-clock retries are off."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigError("provider.type aws: needs boto3 (pip install 'gcs[aws]')") from None

    session = boto3.session.Session(**dict(credentials))
    config = Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60)
    return session.client("ec2", region_name=region, config=config)


class Ec2:
    """EC2 calls by name, off the loop, with throttling backed off on ``clock``."""

    def __init__(
        self,
        client: Any,
        clock: Clock,
        *,
        retries: int = 5,
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 20.0,
        page_size: int = 100,
    ) -> None:
        self.client = client
        self._clock = clock
        self._retries = retries
        self._first_s = first_backoff_s
        self._max_s = max_backoff_s
        self.page_size = page_size
        """``MaxResults`` of a paginated call (5 .. 100 for the calls used here)."""
        self.throttled = 0
        """Calls answered with a throttling error, since start (each retry counts)."""
        self.calls = 0

    async def call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """``client.<operation>(**kwargs)``; ClientError / BotoCoreError as raised."""
        method = getattr(self.client, operation)
        delay = self._first_s
        for attempt in range(self._retries + 1):
            self.calls += 1
            try:
                reply: dict[str, Any] = await asyncio.to_thread(functools.partial(method, **kwargs))
                return reply
            except Exception as err:
                if code_of(err) not in THROTTLE_CODES or attempt == self._retries:
                    raise
                self.throttled += 1
                log.info("aws.throttled", operation=operation, retry_in_s=delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, self._max_s)
        raise AssertionError("unreachable")

    async def pages(self, operation: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
        """Every item under ``key`` over all pages (``NextToken``)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            paging: dict[str, Any] = {"MaxResults": self.page_size}
            if token:
                paging["NextToken"] = token
            reply = await self.call(operation, **kwargs, **paging)
            items.extend(reply.get(key, []))
            token = reply.get("NextToken")
            if not token:
                return items
