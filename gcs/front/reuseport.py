"""Steer new connections on a shared port (SO_REUSEPORT) to the newest listener (Linux).

Members of an HA group on one host bind the same ``host:port`` (``gcs serve --ha``).  The
kernel spreads new connections over every socket of the port's reuseport group by a hash
-- including the socket of an ex-leader that is paused (SIGSTOP, a stalled VM) and cannot
close it: connections hashed there would wait for it.  So the leader, once bound, attaches
a one-instruction classic BPF program to the group (``SO_ATTACH_REUSEPORT_CBPF``; one
program per group, the last attached wins) that returns its own socket's index: every new
connection reaches the leader, whatever else is still bound.

Its index is the group's size minus one when it bound (sockets join the group's array at
the end); the size is the listeners on this address and port, asked of the kernel's socket
diagnostics (``NETLINK_SOCK_DIAG``, listening sockets only: ~0.2 ms) or, where that is
refused, read from ``/proc/net/tcp{,6}`` (every socket of the host: ~5 ms, on a takeover's
path).  Should a socket before it close later, the kernel moves the last one into the gap
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

log = structlog.get_logger("gcs.front")

SO_ATTACH_REUSEPORT_CBPF = 51
_BPF_RET_K = 0x06  # BPF_RET | BPF_K: return the constant
_LISTEN = "0A"


def _listeners(host: str, port: int, family: int) -> int:
    """Sockets listening on ``host:port`` (this network namespace)."""
    try:
        return _diag_listeners(host, port, family)
    except OSError:
        return _proc_listeners(host, port, family)


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x301
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10


def _diag_listeners(host: str, port: int, family: int) -> int:
    """:func:`_listeners` by an ``inet_diag`` dump of the listening TCP sockets."""
    try:
        want: bytes | None = socket.inet_pton(family, host)
    except OSError:
        want = None  # not an address: any listener on the port
    # inet_diag_req_v2: family, protocol, ext, pad, states; then an empty inet_diag_sockid
    # (ports, addresses, interface, cookie = INET_DIAG_NOCOOKIE)
    request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 1 << _TCP_LISTEN)
    request += struct.pack("!HH16s16sI", 0, 0, b"", b"", 0) + b"\xff" * 8
    header = struct.pack(
        "=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(1.0)
        link.send(header + request)
        count = 0
        while True:
            data = link.recv(1 << 16)
            if not data:
                raise OSError("sock_diag: no answer")
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == _NLMSG_DONE:
                    return count
                if kind == _NLMSG_ERROR or length < 16:
                    raise OSError("sock_diag refused the dump")
                # inet_diag_msg after the header: family, state, timer, retrans, then the
                # socket id: source port (big-endian), destination port, source address
                (found_port,) = struct.unpack_from("!H", data, offset + 20)
                address = data[offset + 24 : offset + 24 + (len(want) if want else 0)]
                if found_port == port and (want is None or address == want):
                    count += 1
                offset += (length + 3) & ~3


def _proc_listeners(host: str, port: int, family: int) -> int:
    """:func:`_listeners` from ``/proc/net/tcp{,6}``."""
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
