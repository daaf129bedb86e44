"""Addresses for private test servers: the loopback host and ports that were free a moment
ago, chosen where parallel test workers do not collide."""

from __future__ import annotations

import pathlib
import random
import socket

__all__ = ["HOST", "free_port", "free_ports"]

HOST = "127.0.0.1"


_RESERVED_LOW = 20_000
"""Ports handed out by :func:`free_port` lie between this and the kernel's ephemeral range
(above Ray's default worker ports, 10002-19999)."""
_pick = random.SystemRandom()  # not the global generator: Hypothesis seeds that one


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port that was free a moment ago, for a server started later (often in another
    process, seconds later on a busy machine).

    Chosen at random *below* the ephemeral range: a port from ``bind(("", 0))`` is one the
    kernel also gives to every other ``bind(0)`` and outgoing connection, so with test
    workers in parallel another server could take it in the gap before ours binds it.
    """
    high = _ephemeral_low()
    for _ in range(100):
        if high - _RESERVED_LOW < 1_000:
            break  # no room below the ephemeral range: fall back to the kernel's choice
        port = _pick.randrange(_RESERVED_LOW, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports from :func:`free_port`, for servers started together (each
    was free a moment ago; drawn independently, two could be the same port)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
