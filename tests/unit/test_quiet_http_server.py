"""The in-process fakes' HTTP server never writes a traceback from its threads.

A handler thread formatting a traceback races the test thread's ``ast.parse`` on CPython 3.11
(``SystemError: AST constructor recursion depth mismatch``, failed CI once while the AWS
tests' proxy saw a client reset): hang-ups are ignored, other failures kept in ``errors``.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from gcs.testing.http_server import QuietHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        if self.path == "/boom":
            raise ValueError("bad request body")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def server() -> Iterator[QuietHTTPServer]:
    srv = QuietHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _get(srv: QuietHTTPServer, path: str) -> int | None:
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (http.client.HTTPException, ConnectionError):
        return None
    finally:
        conn.close()


def test_a_client_reset_is_ignored_without_output(
    server: QuietHTTPServer, capfd: pytest.CaptureFixture[str]
) -> None:
    for _ in range(5):
        sock = socket.create_connection(server.server_address[:2])
        sock.sendall(b"GET / HT")  # half a request line: the handler is reading when it resets
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    assert _get(server, "/") == 200  # every earlier connection has been handled by now
    assert server.errors == []
    assert capfd.readouterr().err == ""


def test_a_handler_failure_is_kept_not_printed(
    server: QuietHTTPServer, capfd: pytest.CaptureFixture[str]
) -> None:
    assert _get(server, "/boom") is None
    assert _get(server, "/") == 200
    assert len(server.errors) == 1
    assert "ValueError: bad request body" in server.errors[0]
    assert capfd.readouterr().err == ""
