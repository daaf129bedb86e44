"""The address other machines reach this GCS at, when it listens on every interface.

``gcs serve --host 0.0.0.0`` (the usual setting in a container) binds every interface, but
``0.0.0.0`` is no address to give anyone: the virtual head record that Ray's workers read,
and the node IP and GCS address handed to the dashboard and the head raylet, need the
host's own address.  As Ray's ``get_node_ip_address`` does, that is the source address the
kernel would pick for an outbound route (a UDP ``connect`` sends no packet), falling back to
the host name's address, then loopback.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
_ROUTE_PROBE = ("10.255.255.255", 1)
"""Any non-local address: only the route's source address is read, nothing is sent."""


def primary_ip() -> str:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(_ROUTE_PROBE)
        address = str(s.getsockname()[0])
        if address and address != "0.0.0.0":
            return address
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.gethostname())
    return "127.0.0.1"


def advertised_host(bind_host: str, probe: Callable[[], str] = primary_ip) -> str:
    """``bind_host`` itself unless it is a wildcard; then the host's primary address."""
    return probe() if bind_host in WILDCARD_HOSTS else bind_host
