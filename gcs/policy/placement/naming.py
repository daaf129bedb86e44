"""Ray 2.60's names for the resources a committed bundle exposes on its node.

For a bundle of unit resources ``{R: x}`` with index ``i`` of group ``<hex>`` (the 18-byte
placement group id in hex), a raylet adds

* ``R_group_<i>_<hex>`` = x (this bundle) and ``R_group_<hex>`` += x (any bundle of the group,
  the "wildcard" resource), and
* ``bundle_group_<i>_<hex>`` = 1000 and ``bundle_group_<hex>`` += 1000 (Ray's bundle marker,
  ``kBundle_ResourceLabel`` with 1000 units per bundle).

Shared by the raylet agent (accounting) and tests; the GCS never needs more than the ids.
"""

from __future__ import annotations

from collections.abc import Mapping

GROUP_KEYWORD = "_group_"
BUNDLE_RESOURCE = "bundle"
BUNDLE_RESOURCE_UNITS = 1000.0

BundleKey = tuple[bytes, int]
"""(placement group id, bundle index)."""

_PG_ID_HEX = 36  # an 18-byte placement group id in hex


def is_group_resource(name: str) -> bool:
    """A name a committed bundle exposes (``R_group_<i>_<hex>`` / ``R_group_<hex>``), not a
    node's own resource.  Cheap (the scheduler asks it of every name of a changed node):
    ``_group_`` and a ``_``-separated tail as long as a group id's hex."""
    return (
        len(name) > _PG_ID_HEX + len(GROUP_KEYWORD)
        and name[-_PG_ID_HEX - 1] == "_"
        and GROUP_KEYWORD in name
    )


def indexed_name(resource: str, pg_id: bytes, index: int) -> str:
    return f"{resource}{GROUP_KEYWORD}{index}_{pg_id.hex()}"


def wildcard_name(resource: str, pg_id: bytes) -> str:
    return f"{resource}{GROUP_KEYWORD}{pg_id.hex()}"


def bundle_resources(
    pg_id: bytes, index: int, unit_resources: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """(indexed resources of this bundle, its contribution to the group's wildcards)."""
    amounts = {name: float(v) for name, v in unit_resources.items() if v > 0}
    amounts[BUNDLE_RESOURCE] = BUNDLE_RESOURCE_UNITS
    indexed = {indexed_name(name, pg_id, index): v for name, v in amounts.items()}
    wildcard = {wildcard_name(name, pg_id): v for name, v in amounts.items()}
    return indexed, wildcard
