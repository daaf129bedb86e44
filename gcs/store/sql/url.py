"""Normalise SQL storage URLs onto the async drivers gcs ships with."""

from __future__ import annotations

__all__ = ["normalize_sql_url"]

_DRIVER_FOR_SCHEME = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
}


def normalize_sql_url(url: str) -> str:
    """Map ``sqlite://`` to aiosqlite and ``postgres(ql)://`` to asyncpg; reject other drivers.

    >>> normalize_sql_url("postgres://u@h/db")
    'postgresql+asyncpg://u@h/db'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"storage URL {url!r}: expected SCHEME://...")
    driver = _DRIVER_FOR_SCHEME.get(scheme.lower())
    if driver is None:
        raise ValueError(
            f"storage URL {url!r}: unsupported SQL driver {scheme!r}; "
            "use sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
        )
    return f"{driver}://{rest}"
