"""One place that turns Ray's auth/TLS environment into channels, ports and metadata.

``Security.from_env()`` is what every client of ours uses (SDK, CLI, raylet agent, fleet,
subscriber, planner); ``Security.for_server(...)`` adds the server's own flag/config sources.
Every channel we open goes through :meth:`Security.aio_channel` / :meth:`Security.channel`:
with a token they carry ``authorization: Bearer ...`` on every call (a client interceptor,
present only in token mode so the default path costs nothing), with TLS they are secure
channels presenting the node certificate.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gcs.base.auth import AuthToken, client_token, load_token, parse_mode
from gcs.base.tls import TlsFiles

ChannelOptions = Sequence[tuple[str, Any]]


@dataclass(frozen=True, slots=True)
class Security:
    token: AuthToken | None = None
    tls: TlsFiles | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Security:
        """Client side: ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN*`` / ``RAY_USE_TLS`` / ``RAY_TLS_*``.

        Raises :class:`gcs.base.auth.AuthConfigError` on a misconfiguration."""
        env = os.environ if env is None else env
        return cls(client_token(env), TlsFiles.from_env(env))

    @classmethod
    def for_server(
        cls,
        auth_mode: str,
        auth_token_path: str = "",
        env: Mapping[str, str] | None = None,
        *,
        token_path_what: str = "auth_token_path",
    ) -> Security:
        """Server side: ``auth_mode``/``auth_token_path`` already merged by config precedence."""
        env = os.environ if env is None else env
        token = None
        if parse_mode(auth_mode, "auth_mode") == "token":
            token = load_token(env, explicit_path=auth_token_path, explicit_what=token_path_what)
        return cls(token, TlsFiles.from_env(env))

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self.token.metadata() if self.token is not None else ()

    def describe(self) -> dict[str, str]:
        """Safe to log: the mode, where the token came from, TLS on/off (never the token)."""
        out = {"auth": "token" if self.token else "disabled", "tls": "on" if self.tls else "off"}
        if self.token is not None:
            out["token_source"] = self.token.source
        return out

    # -- clients ---------------------------------------------------------------------------

    def aio_channel(self, address: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
        interceptors = [_AioAddMetadata(self.metadata)] if self.token is not None else None
        if self.tls is not None:
            return grpc.aio.secure_channel(
                address,
                self.tls.channel_credentials(),
                options=list(options),
                interceptors=interceptors,
            )
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)

    def channel(self, address: str, options: ChannelOptions = ()) -> grpc.Channel:
        """Blocking twin of :meth:`aio_channel`."""
        if self.tls is not None:
            channel = grpc.secure_channel(address, self.tls.channel_credentials(), list(options))
        else:
            channel = grpc.insecure_channel(address, list(options))
        if self.token is not None:
            channel = grpc.intercept_channel(channel, _SyncAddMetadata(self.metadata))
        return channel

    # -- servers ---------------------------------------------------------------------------

    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        if self.tls is not None:
            return server.add_secure_port(address, self.tls.server_credentials())
        return server.add_insecure_port(address)


NO_SECURITY = Security()


def _merged(metadata: Any, extra: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return (*tuple(metadata or ()), *extra)


class _AioAddMetadata(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(
            details._replace(metadata=_merged(details.metadata, self._metadata)), request
        )

    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(
            details._replace(metadata=_merged(details.metadata, self._metadata)), request
        )


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _SyncAddMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(
            d.method,
            d.timeout,
            _merged(d.metadata, self._metadata),
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)
