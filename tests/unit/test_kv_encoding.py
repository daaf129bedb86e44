"""The stored KV key encoding is injective and scopes prefixes exactly (issue 12, defect 1)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gcs.managers.kv import decode_key, encode_key, namespace_prefix

# Bytes rich in the characters that matter to the encoding.
_ALPHABET = st.sampled_from([b"@", b"%", b":", b"3", b"A", b"2", b"5", b"n", b"\x00", b"\xff"])
_BYTES = st.lists(_ALPHABET, max_size=8).map(b"".join)
_PAIRS = st.tuples(_BYTES, _BYTES)


@given(_PAIRS, _PAIRS)
def test_distinct_pairs_never_share_a_stored_key(
    a: tuple[bytes, bytes], b: tuple[bytes, bytes]
) -> None:
    assert (encode_key(*a) == encode_key(*b)) == (a == b)


@given(_PAIRS)
def test_decode_inverts_encode(pair: tuple[bytes, bytes]) -> None:
    assert decode_key(encode_key(*pair)) == pair


@given(_PAIRS, _BYTES, _BYTES)
def test_a_prefix_scan_finds_exactly_the_namespace_keys_with_that_prefix(
    pair: tuple[bytes, bytes], namespace: bytes, prefix: bytes
) -> None:
    stored = encode_key(*pair)
    in_scope = pair[0] == namespace and pair[1].startswith(prefix)
    assert stored.startswith(encode_key(namespace, prefix)) == in_scope


def test_ray_namespaces_keep_rays_bytes() -> None:
    assert encode_key(b"cluster", b"ray_cluster_id") == b"@namespace_cluster:ray_cluster_id"
    assert namespace_prefix(b"") == b"@namespace_:"
