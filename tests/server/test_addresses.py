"""``gcs serve --host 0.0.0.0 --head``: what others are told to dial is never the wildcard."""

from __future__ import annotations

import ipaddress

import pytest

from gcs.server import GcsServer
from gcs.server.addresses import WILDCARD_HOSTS, advertised_host, primary_ip
from tests.conftest import fast_config


@pytest.mark.parametrize("wildcard", sorted(WILDCARD_HOSTS))
def test_a_wildcard_bind_advertises_the_hosts_own_address(wildcard: str) -> None:
    assert advertised_host(wildcard, probe=lambda: "10.1.2.3") == "10.1.2.3"


def test_a_concrete_bind_address_is_advertised_as_it_is() -> None:
    assert advertised_host("127.0.0.2", probe=lambda: "10.1.2.3") == "127.0.0.2"


def test_the_primary_address_is_a_concrete_ipv4_address() -> None:
    address = ipaddress.IPv4Address(primary_ip())
    assert not address.is_unspecified


def test_the_server_hands_children_and_the_head_record_a_dialable_address() -> None:
    """Before: the virtual head's ``node_manager_address`` and the dashboard's
    ``--node-ip-address`` were ``0.0.0.0`` under ``--host 0.0.0.0``."""
    server = GcsServer(fast_config(host="0.0.0.0", head=True))
    assert server.advertised_host not in WILDCARD_HOSTS
    assert server.advertised_address == f"{server.advertised_host}:{server.port}"
    assert GcsServer(fast_config(host="127.0.0.3")).advertised_host == "127.0.0.3"
