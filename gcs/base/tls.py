"""Ray's TLS settings: ``RAY_USE_TLS``, ``RAY_TLS_SERVER_CERT`` / ``_KEY``, ``RAY_TLS_CA_CERT``.

Ray's semantics (``grpc_server.cc``, ``BuildChannel``, ``ray/_common/tls_utils.py``): with
TLS on, every server presents the cert/key and *requires and verifies* a client certificate
signed by the CA (mutual TLS), and every client trusts the CA and presents the same cert/key
as its client certificate.  All three files are required; a missing or unreadable one is a
misconfiguration reported at start.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from gcs.base.auth import AuthConfigError

TLS_FILE_VARS = ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")


def tls_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_chain: bytes = field(repr=False)
    private_key: bytes = field(repr=False)
    ca_cert: bytes = field(repr=False)
    paths: tuple[str, str, str]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TlsFiles | None:
        """``None`` when ``RAY_USE_TLS`` is off; else the three files, read now."""
        env = os.environ if env is None else env
        if not tls_enabled(env):
            return None
        missing = [name for name in TLS_FILE_VARS if not env.get(name)]
        if missing:
            raise AuthConfigError(
                f"RAY_USE_TLS is on but {', '.join(missing)} not set "
                f"(Ray needs {', '.join(TLS_FILE_VARS)})"
            )
        paths = tuple(env[name] for name in TLS_FILE_VARS)
        contents = [_read(name, path) for name, path in zip(TLS_FILE_VARS, paths, strict=True)]
        return cls(contents[0], contents[1], contents[2], paths)  # type: ignore[arg-type]

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.ca_cert,
            require_client_auth=True,
        )

    def ssl_server_context(self) -> ssl.SSLContext:
        """The same mutual TLS for an asyncio server (the front server), ALPN ``h2``."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(certfile=self.paths[0], keyfile=self.paths[1])
            ctx.load_verify_locations(cadata=self.ca_cert.decode("ascii"))
        except (OSError, ssl.SSLError, UnicodeDecodeError) as err:
            raise AuthConfigError(f"RAY_TLS_SERVER_CERT/KEY/CA_CERT: cannot load: {err}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2"])
        return ctx

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_cert,
            private_key=self.private_key,
            certificate_chain=self.cert_chain,
        )


def _read(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as err:
        raise AuthConfigError(f"{name}: cannot read {path}: {err.strerror}") from None
    if not data.strip():
        raise AuthConfigError(f"{name}: {path} is empty")
    return data
