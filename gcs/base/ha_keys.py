"""Where the leader of a ``gcs serve --ha`` group records itself, in the GCS's internal KV.

Shared by the server (which writes it) and the SDK (``gcs status`` reads it), in a module of
its own so the server does not import the client SDK to name a key.
"""

from __future__ import annotations

HA_NAMESPACE = b"gcs_ha"
HA_LEADER_KEY = b"leader"
"""Written at each takeover: JSON ``{"holder", "epoch", "since"}``."""
