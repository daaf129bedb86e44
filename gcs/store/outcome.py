"""Turn an ambiguous write into a definite answer before anyone acts on it.

Backends already try (bounded) to resolve an ambiguous failure themselves; what reaches a
caller as :class:`StoreOutcomeUnknown` could not be resolved then.  ``write_definite`` asks
once more (the backend may be back by now) so a manager can answer its client truthfully:
the write landed (carry on as if it had returned), it certainly did not (StoreUnavailable:
"nothing was written"), or nobody can tell yet (StoreOutcomeUnknown, "may have been applied").
"""

from __future__ import annotations

from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreOutcomeUnknown, StoreUnavailable

__all__ = ["write_definite"]


async def write_definite(store: Store, batch: WriteBatch) -> None:
    """``store.write(batch)``, resolving StoreOutcomeUnknown with :meth:`Store.landed`."""
    try:
        await store.write(batch)
    except StoreOutcomeUnknown as unknown:
        try:
            landed = await store.landed(unknown.write_id)
        except StoreUnavailable:
            raise unknown from None
        if not landed:
            raise StoreUnavailable(f"write {unknown.write_id.hex()} did not land") from unknown
