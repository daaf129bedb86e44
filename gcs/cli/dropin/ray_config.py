"""Ray's ``--config_list`` (base64 JSON of RayConfig overrides) mapped onto :class:`GcsConfig`.

Ray's GCS reads each knob from the JSON when present, else from ``RAY_<name>`` in its
environment, else its default; and it serves the JSON as it came to every raylet
(``GetInternalConfig``: worker nodes adopt the head's system config).  Here:

* knobs our GCS has (``gcs.config.RAY_FILE_KEYS``, e.g. ``health_check_period_ms``) become
  flag-level overrides of :func:`gcs.config.load_config`, so they beat ``RAY_<name>``, which
  beats the default, as in Ray;
* unsigned knobs (``gcs.config.RAY_UNSIGNED_BITS``) given a negative number wrap as Ray's
  JSON reader wraps them (``-1`` = the type's maximum);
* the storage knobs pick the store: Redis when ``--redis_address`` is given, else
  ``gcs_storage``: ``memory`` (Ray's default; a restarted GCS is a new cluster) or
  ``rocksdb`` (persistent on the local disk under ``gcs_storage_path``: our embedded SQLite
  store takes that role);
* ``enable_autoscaler_v2`` (or ``RAY_enable_autoscaler_v2``) is what the GCS publishes as
  ``__autoscaler``/``__autoscaler_v2_enabled``;
* every other knob is a raylet's or a worker's business (or a GCS internal we do not have):
  it is served unchanged through ``GetInternalConfig`` and named once in the log.
  (Ray 2.60's binary aborts on a name it does not know; we ignore it, with the same log line.)
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gcs.cli.dropin.flags import GcsServerFlags
from gcs.config import RAY_FILE_KEYS, ray_knob_value
from gcs.store.registry import STORES

STORAGE_KNOBS = ("gcs_storage", "gcs_storage_path")
AUTOSCALER_V2_KNOB = "enable_autoscaler_v2"


class RayConfigError(ValueError):
    """``--config_list`` or a storage flag is unusable; the message names it."""


@dataclass(frozen=True, slots=True)
class MappedConfig:
    """What the drop-in hands to :func:`gcs.config.load_config`, and what it left alone."""

    overrides: dict[str, Any]
    """Dotted ``GcsConfig`` paths -> values (flag precedence)."""
    raw_json: str
    """The decoded ``--config_list`` (served by ``GetInternalConfig``); ``""`` when empty."""
    storage: str
    autoscaler_v2: bool
    not_used: list[str] = field(default_factory=list)
    """Knobs this GCS does not act on (still served to raylets)."""


def decode_config_list(encoded: str) -> dict[str, Any]:
    """Base64 JSON object -> dict (``""`` -> ``{}``, as Ray takes an empty list)."""
    if not encoded:
        return {}
    try:
        text = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise RayConfigError("--config_list: not a valid base64-encoded string") from None
    if not text.strip():
        return {}
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as err:
        raise RayConfigError(f"--config_list: not JSON ({err.msg} at {err.pos})") from None
    if not isinstance(loaded, dict):
        raise RayConfigError("--config_list: must be a JSON object of RayConfig knobs")
    return loaded


def _env_bool(text: str) -> bool:
    return text.strip().lower() in {"1", "true"}


def storage_url(flags: GcsServerFlags, knobs: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """Redis if ``--redis_address`` is set, else Ray's ``gcs_storage`` (memory | rocksdb)."""
    if flags.redis_address:
        if flags.redis_port <= 0 or flags.redis_port > 65535:
            raise RayConfigError(
                f"--redis_port: must be a port (1..65535) with --redis_address, "
                f"got {flags.redis_port}"
            )
        scheme = "rediss" if flags.redis_enable_ssl else "redis"
        auth = ""
        if flags.redis_username or flags.redis_password:
            user = urllib.parse.quote(flags.redis_username, safe="")
            password = urllib.parse.quote(flags.redis_password, safe="")
            auth = f"{user}:{password}@" if password else f"{user}@"
        host = flags.redis_address
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 literal
        return f"{scheme}://{auth}{host}:{flags.redis_port}/0"
    kind = str(knobs.get("gcs_storage", env.get("RAY_gcs_storage", "memory")) or "memory")
    kind = kind.strip().lower()
    row = STORES.for_ray_storage(kind)  # the store registry says which row stands in for it
    if row is None or row.ray_url is None:
        raise RayConfigError(
            f"gcs_storage: {kind!r} is not one of {', '.join(STORES.ray_storages())} "
            "(Ray 2.60's backends)"
        )
    path = str(knobs.get("gcs_storage_path", env.get("RAY_gcs_storage_path", "")) or "")
    try:
        return row.ray_url(path)
    except ValueError as err:
        raise RayConfigError(str(err)) from None


def map_config(flags: GcsServerFlags, env: Mapping[str, str]) -> MappedConfig:
    """Everything the drop-in takes from Ray's command line and RayConfig knobs."""
    knobs = decode_config_list(flags.config_list)
    overrides: dict[str, Any] = {}
    not_used: list[str] = []
    for name, value in knobs.items():
        if name in RAY_FILE_KEYS:
            overrides[RAY_FILE_KEYS[name]] = ray_knob_value(name, value)
        elif name not in (*STORAGE_KNOBS, AUTOSCALER_V2_KNOB):
            not_used.append(name)
    if AUTOSCALER_V2_KNOB in knobs:
        v2 = knobs[AUTOSCALER_V2_KNOB]
        autoscaler_v2 = v2 if isinstance(v2, bool) else _env_bool(str(v2))
    else:
        autoscaler_v2 = _env_bool(env.get("RAY_enable_autoscaler_v2", ""))
    raw_json = json.dumps(knobs) if knobs else ""
    return MappedConfig(
        overrides=overrides,
        raw_json=raw_json,
        storage=storage_url(flags, knobs, env),
        autoscaler_v2=autoscaler_v2,
        not_used=sorted(not_used),
    )
