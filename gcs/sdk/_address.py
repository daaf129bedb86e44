"""Which GCS to talk to: the explicit argument, else ``GCS_ADDRESS``, else ``RAY_ADDRESS``."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gcs.sdk._errors import AddressNotFound

ENV_VARS = ("GCS_ADDRESS", "RAY_ADDRESS")


def resolve_address(address: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``host:port`` of the GCS.  ``environ`` defaults to ``os.environ`` (tests pass a dict)."""
    if address:
        return address
    env = os.environ if environ is None else environ
    for name in ENV_VARS:
        value = env.get(name, "").strip()
        if value and value != "auto":
            return value
    raise AddressNotFound(
        "no GCS address: pass address='host:port' or set GCS_ADDRESS (or RAY_ADDRESS)"
    )
