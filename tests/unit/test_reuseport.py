"""Counting the listeners of a shared port (``gcs.front.reuseport``): a new HA leader's
index in the port's reuseport group.  Asked of the kernel's socket diagnostics (a takeover
does not read every socket of the host from /proc); /proc is the fallback and agrees."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import pytest

from gcs.front import reuseport

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _listener(host: str, port: int, family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen()
    return sock


@pytest.fixture
def group() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_the_members_of_a_shared_port_are_counted_alike_by_diag_and_proc(
    group: list[socket.socket],
) -> None:
    group.append(_listener("127.0.0.1", 0))
    port = group[0].getsockname()[1]
    counts = []
    for _ in range(3):
        counts.append(
            (
                reuseport._diag_listeners("127.0.0.1", port, socket.AF_INET),
                reuseport._proc_listeners("127.0.0.1", port, socket.AF_INET),
                reuseport._listeners("127.0.0.1", port, socket.AF_INET),
            )
        )
        group.append(_listener("127.0.0.1", port))
    assert counts == [(1, 1, 1), (2, 2, 2), (3, 3, 3)]
    group.pop().close()
    group.pop().close()
    assert reuseport._diag_listeners("127.0.0.1", port, socket.AF_INET) == 2, "closed: gone"
    assert reuseport._diag_listeners("127.0.0.2", port, socket.AF_INET) == 0, "another address"
    assert reuseport._diag_listeners("localhost", port, socket.AF_INET) == 2, "a name: any"


def test_ipv6_listeners_are_counted(group: list[socket.socket]) -> None:
    try:
        group.append(_listener("::1", 0, socket.AF_INET6))
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = group[0].getsockname()[1]
    group.append(_listener("::1", port, socket.AF_INET6))
    assert reuseport._diag_listeners("::1", port, socket.AF_INET6) == 2
    assert reuseport._proc_listeners("::1", port, socket.AF_INET6) == 2


def test_proc_is_read_when_the_kernel_refuses_the_dump(
    group: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    group.append(_listener("127.0.0.1", 0))
    port = group[0].getsockname()[1]

    def refused(host: str, port: int, family: int) -> int:
        raise PermissionError("sock_diag")

    monkeypatch.setattr(reuseport, "_diag_listeners", refused)
    assert reuseport._listeners("127.0.0.1", port, socket.AF_INET) == 1
