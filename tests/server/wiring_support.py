"""A GCS wired in memory for tests of the wiring itself: everything built, nothing opened,
no raylet reached (a recording fake gateway), time on a fake clock."""

from __future__ import annotations

from typing import Any

from gcs.base.clock import FakeClock
from gcs.config import GcsConfig
from gcs.rpc.security import Security
from gcs.server.metrics import GcsMetrics
from gcs.server.wiring import Wiring, build
from gcs.store import Store
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway
from tests.conftest import fast_config


def built_wiring(
    cfg: GcsConfig | None = None,
    *,
    store: Store | None = None,
    raylets: FakeRayletGateway | None = None,
    **extra: Any,
) -> Wiring:
    """``build`` over a memory store (or ``store``), with ``fast_config()`` (or ``cfg``);
    ``extra`` goes to ``build`` as it is (an actor gateway, say)."""
    return build(
        cfg or fast_config(),
        store=store if store is not None else MemoryStore(),
        owns_store=False,
        clock=FakeClock(),
        security=Security(),
        metrics=GcsMetrics(),
        advertised_host="127.0.0.1",
        raylets=raylets or FakeRayletGateway(),
        **extra,
    )
