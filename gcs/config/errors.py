"""The one error of configuration (:class:`ConfigError`)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A config value is malformed; the message names the source and the key."""
