"""The Redis backend (``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``).

Modules, each importing only those above it in this list: ``options`` (tuning),
``scripts`` (the Lua), ``ha`` (HA keys and replies), ``topology`` (the master of a
deployment: the interface and a standalone server), ``sentinel`` and ``cluster`` (the
other deployments), ``connect`` (URL -> topology), ``runner`` (one script with retries,
WAIT and "maybe sent"), ``store`` (:class:`~gcs.store.redis.store.RedisStore`).

Nothing here is imported by the package itself: a GCS on SQL never imports redis-py.
"""
