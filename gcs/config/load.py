"""Loading: default < front end's defaults < YAML file < environment < flags, into the
frozen schema, then validated once (:func:`load_config`)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from gcs.base.auth import AuthConfigError, parse_mode
from gcs.config.checks import validate
from gcs.config.errors import ConfigError
from gcs.config.keys import ENV_VARS, RAY_FILE_KEYS, TOKEN_ENV_VARS, ray_knob_value
from gcs.config.schema import GcsConfig

__all__ = ["load_config"]


def _coerce(value: Any, target: Any, where: str) -> Any:
    if target is int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if target is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if target is str:
        return str(value)
    if target is bool:
        return _coerce_bool(value, where)
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _coerce_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    node = tree
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _build(cls: type, data: Mapping[str, Any], where: str, path: str = "") -> Any:
    """``cls`` from ``data``; ``path`` is ``cls``'s place in the tree (``health.``), so an
    error names a value's environment variable too."""
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        f = known[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}.{name}: expected a mapping")
            kwargs[name] = _build(type(default), value, f"{where}.{name}", f"{path}{name}.")
        else:
            target = type(f.default) if f.default is not dataclasses.MISSING else str
            env = [var for var, p in ENV_VARS.items() if p == f"{path}{name}"]
            named = f"{where}.{name}" + (f" ({', '.join(env)})" if env else "")
            kwargs[name] = _coerce(value, target, named)
    return cls(**kwargs)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(
    *,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> GcsConfig:
    """Merge default < ``defaults`` < file < environment < flags (flags as dotted paths).

    ``defaults`` lets a front end (``gcs serve``) choose defaults of its own, such as
    a fixed metrics port, without changing the dataclass defaults embedders rely on.
    """
    tree: dict[str, Any] = {}
    for path, value in (defaults or {}).items():
        _set_path(tree, path, value)
    if config_file:
        import yaml  # only for a file: a serving GCS does not hold the YAML library otherwise

        try:
            loaded = yaml.safe_load(pathlib.Path(config_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from exc
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"config file {config_file}: top level must be a mapping")
        tree = _merge(tree, _ray_keys_to_paths(loaded))
    env = os.environ if env is None else env
    env_tree: dict[str, Any] = {}
    for var, path in ENV_VARS.items():
        if var in env and env[var] != "":
            _set_path(env_tree, path, ray_knob_value(var.removeprefix("RAY_"), env[var]))
    tree = _merge(tree, env_tree)
    if any(env.get(var, "").strip() for var in TOKEN_ENV_VARS):
        tree.pop("auth_token_path", None)  # env > file; the flag (below) still wins
    flag_tree: dict[str, Any] = {}
    for path, value in (flags or {}).items():
        if value is not None:
            _set_path(flag_tree, path, value)
    tree = _merge(tree, flag_tree)
    where = f"config ({config_file})" if config_file else "config"
    config = _build(GcsConfig, tree, where)
    try:
        config = dataclasses.replace(
            config, auth_mode=parse_mode(config.auth_mode, f"{where}.auth_mode")
        )
    except AuthConfigError as err:
        raise ConfigError(str(err)) from None
    validate(config, where)
    return config


def _ray_keys_to_paths(loaded: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in loaded.items():
        if isinstance(key, str) and key in RAY_FILE_KEYS:
            _set_path(out, RAY_FILE_KEYS[key], ray_knob_value(key, value))
    rest = {k: v for k, v in loaded.items() if k not in RAY_FILE_KEYS}
    return _merge(rest, out)
