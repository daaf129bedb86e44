"""Steer new connections on a shared port (SO_REUSEPORT) to the newest listener (Linux).

Members of an HA group on one host bind the same ``host:port`` (``gcs serve --ha``).  The
kernel spreads new connections over every socket of the port's reuseport group by a hash
-- including the socket of an ex-leader that is paused (SIGSTOP, a stalled VM) and cannot
close it: connections hashed there would wait for it.  So the leader, once bound, attaches
a one-instruction classic BPF program to the group (``SO_ATTACH_REUSEPORT_CBPF``; one
program per group, the last attached wins) that returns its own socket's index: every new
connection reaches the leader, whatever else is still bound.

Its index is the group's size minus one when it bound (sockets join the group's array at
the end); the size is counted from ``/proc/net/tcp{,6}`` (listeners on this address and
port).  Should a socket before it close later, the kernel moves the last one into the gap
and an index past the end falls back to the hash: never worse than without the program.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
import sys
from typing import Any

import structlog

__all__ = ["steer_to_newest"]

log = structlog.get_logger("gcs.rpc.front")

SO_ATTACH_REUSEPORT_CBPF = 51
_BPF_RET_K = 0x06  # BPF_RET | BPF_K: return the constant
_LISTEN = "0A"


def _listeners(host: str, port: int, family: int) -> int:
    """Sockets listening on ``host:port`` (this network namespace)."""
    table = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        with open(table) as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return 0
    want_port = f"{port:04X}"
    want_addr = _proc_address(host, family)
    count = 0
    for row in rows:
        fields = row.split()
        if len(fields) < 4 or fields[3] != _LISTEN:
            continue
        addr, _, found_port = fields[1].partition(":")
        if found_port == want_port and (want_addr is None or addr == want_addr):
            count += 1
    return count


def _proc_address(host: str, family: int) -> str | None:
    """``host`` as /proc/net/tcp spells it (32-bit words in host byte order, hex)."""
    try:
        packed = ipaddress.ip_address(host).packed
    except ValueError:
        return None
    words = struct.unpack(f"<{len(packed) // 4}I", packed)  # as a little-endian host reads them
    return "".join(f"{word:08X}" for word in words)


def steer_to_newest(sock: Any) -> bool:
    """Attach the program (see the module doc) to ``sock``'s reuseport group (a socket or
    asyncio's TransportSocket); whether it was attached (never raises: without it the
    kernel's hash applies)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        host, port = sock.getsockname()[:2]
        index = _listeners(host, port, sock.family) - 1
        if index < 0:
            return False
        instruction = struct.pack("=HBBI", _BPF_RET_K, 0, 0, index)
        program = ctypes.create_string_buffer(instruction, len(instruction))
        fprog = struct.pack("=HxxxxxxQ", 1, ctypes.addressof(program))
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError as err:
        log.warning("reuseport.steer_failed", error=str(err))
        return False
    log.info("reuseport.steered", port=port, index=index)
    return True
