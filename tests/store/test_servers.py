"""The private test servers: missing binaries are explained, restarts keep port and data."""

from __future__ import annotations

import pytest

from gcs.testing.servers import MissingServerBinary, RedisServer, find_binary


class TestServerHelpers:
    """gcs.testing.servers finds binaries and restarts servers in place."""

    def test_missing_binary_names_the_package_to_install(self) -> None:
        """An absent binary raises MissingServerBinary with the apt-get command."""
        with pytest.raises(MissingServerBinary, match="apt-get install -y some-package"):
            find_binary("gcs-no-such-binary", package="some-package")

    def test_redis_restart_keeps_port_and_appendonly_data(self) -> None:
        """stop() then start() serves the same port with the data written before."""
        server = RedisServer().start()
        try:
            port = server.port
            _send(server.port, b"SET k v\r\n")
            server.stop(kill=True)
            assert not server.running
            server.start()
            assert server.port == port
            assert _send(server.port, b"GET k\r\n") == b"$1\r\nv\r\n"
        finally:
            server.cleanup()


def _send(port: int, command: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(command)
        return sock.recv(128)
