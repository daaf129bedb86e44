"""Ray cluster-launcher YAML -> typed, validated scheduler config.

Follows Ray's ``AutoscalingConfig``: the head type's max gets +1, the cluster cap is
``max_workers + 1``, ``idle_timeout_minutes`` becomes seconds. Errors name the place.

Read as Ray 2.60 reads it (``prepare_config``, ``fillout_available_node_types_resources``,
``validate_config``): every key of Ray's schema is accepted (``launcher_yaml``), the
provider's ``defaults.yaml`` lies under the YAML, a worker type without ``max_workers`` takes
the cluster's, and :func:`resolve_cluster_config` fills each node type's resources from what
the provider's cloud says of its instance type (``node_resources``; the YAML's keys win).
Without such a provider, a node type the autoscaler may launch must spell its resources out.

KubeRay in-place pod resize lives on the RayCluster (``ray.io/ippr`` annotation), not in a
cluster YAML; here a node type takes the same group entry under ``ippr``::

    available_node_types:
      small-group:
        resources: {CPU: 1, memory: 1073741824}
        ippr: {max-cpu: "4", max-memory: 4Gi, resize-timeout: 60}

``max-cpu`` / ``max-memory`` accept numbers or Kubernetes quantities; the type's CPU and
memory resources are the pod template size (the IPPR minimum).

Beyond Ray's schema, how scale-down may disrupt nodes and how long a node type the cloud
refused is held back (both optional)::

    disruption:
      budget: 2                      # at most 2 nodes (or "20%" of the workers) leaving at once
      do_not_disrupt_label: ray.io/do-not-disrupt   # "true": not idle-terminated (max_* apply)
    capacity_backoff: {initial_s: 60, max_s: 600}
"""

from __future__ import annotations

import math
import pkgutil
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import yaml

from gcs.autoscaler import node_resources
from gcs.autoscaler.launcher_yaml import (
    RAY_LEGACY_TOP_KEYS,
    RAY_NODE_TYPE_KEYS,
    RAY_PROVIDER_KEYS,
    RAY_TOP_KEYS,
    ConfigError,
    Launcher,
    launcher,
    no_unknown,
    node_type_launcher,
    unused_keys,
)
from gcs.autoscaler.providers.registry import PROVIDERS, ProviderRow, Registry
from gcs.policy.autoscaling.capacity import CapacityBackoff
from gcs.policy.autoscaling.scheduler.types import (
    IpprSpec,
    NodeTypeConfig,
    Options,
    SchedulerConfig,
)


@dataclass(frozen=True)
class ProviderConfig:
    """``provider:`` of the cluster YAML.  ``type`` names a row of the provider registry
    (:data:`~gcs.autoscaler.providers.registry.PROVIDERS`)."""

    type: str = "local"
    state_dir: str = ""
    """Where a provider that starts processes remembers them ("" = under the data dir)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The other keys, kept as given (e.g. kuberay's namespace and cluster name)."""
    settings: object = None
    """What the row's section parser made of them (None without one); only the provider
    reads it."""


SectionParser = Callable[[Mapping[str, Any], Mapping[Any, Any]], object]
"""A provider row's ``section``: ``(provider mapping, available_node_types) -> settings``,
raising :class:`ConfigError` naming the offending place."""

CloudConfigReader = Callable[
    [ProviderConfig, "Options | None"], Coroutine[Any, Any, "ClusterConfig"]
]
"""A provider row's ``cloud_config``: the cluster config as the cloud holds it, for the
provider section given on the command line; :class:`ConfigError` (one line) if it cannot
be read."""


@dataclass(frozen=True)
class ClusterConfig:
    scheduler: SchedulerConfig
    head_node_type: str
    upscaling_speed: float = 0.0
    provider: ProviderConfig = field(default_factory=ProviderConfig)
    cluster_name: str = "default"
    capacity_backoff: CapacityBackoff = field(default_factory=CapacityBackoff)
    """How long a node type the cloud refused (capacity, quota) is held back."""
    launcher: Launcher = field(default_factory=Launcher)
    """The cluster-launcher keys (setup/start commands, Docker, file mounts, SSH, each node
    type's ``node_config``), for the providers that start machines."""
    warnings: tuple[str, ...] = ()
    """What a user should read once (the keys nothing here acts on)."""


def _number(value: Any, where: str, *, minimum: float | None = 0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum:g}, got {value!r}")
    return float(value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "E": 1e18,
}  # fmt: skip


def quantity(value: Any, where: str) -> float:
    """A Kubernetes quantity ("1500m", "8Gi", 2147483648) as a plain number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(value, where)
    if isinstance(value, str):
        text = value.strip()
        for suffix in sorted(_SUFFIXES, key=len, reverse=True):
            if text.endswith(suffix):
                number, scale = text[: -len(suffix)], _SUFFIXES[suffix]
                break
        else:
            number, scale = text, 1
        try:
            return _number(float(number), where) * scale
        except ValueError:
            pass
    raise ConfigError(f"{where}: expected a number or Kubernetes quantity, got {value!r}")


def _ippr(raw: Any, where: str, res: Mapping[str, float]) -> IpprSpec | None:
    """The ``ray.io/ippr`` group entry (max-cpu, max-memory, resize-timeout; ``_`` also ok)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    values = {}
    for key in ("max-cpu", "max-memory", "resize-timeout"):
        alias = key.replace("-", "_")
        if key not in raw and alias not in raw:
            raise ConfigError(f"{where}.{key}: required")
        values[key] = raw.get(key, raw.get(alias))
    return IpprSpec(
        max_cpu=quantity(values["max-cpu"], f"{where}.max-cpu"),
        max_memory=float(int(quantity(values["max-memory"], f"{where}.max-memory"))),
        min_cpu=res.get("CPU", 0.0),
        min_memory=res.get("memory", 0.0),
        resize_timeout_s=_int(values["resize-timeout"], f"{where}.resize-timeout"),
    )


# Ray's cluster-launcher keys (all accepted, see ``launcher_yaml``) plus ours.
_OUR_TOP_KEYS = frozenset({"disruption", "capacity_backoff"})
_TOP_KEYS = RAY_TOP_KEYS | RAY_LEGACY_TOP_KEYS | _OUR_TOP_KEYS
_OUR_NODE_TYPE_KEYS = frozenset({"launch_config_hash", "ippr"})
_NODE_TYPE_KEYS = RAY_NODE_TYPE_KEYS | _OUR_NODE_TYPE_KEYS
# Every provider accepts these (Ray's schema's provider keys, ours) beside its own.
_PROVIDER_KEYS = RAY_PROVIDER_KEYS | {"state_dir"}
_no_unknown = no_unknown


def provider_config(
    raw: Any, types_raw: Mapping[Any, Any], providers: Registry = PROVIDERS
) -> ProviderConfig:
    """``provider:`` checked against its registry row: the type, the keys the row takes,
    then the row's own section parser."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError("provider: expected a mapping")
    kind = raw.get("type", "local")
    if kind not in providers:
        raise ConfigError(
            f"provider.type: {kind!r} is not supported here (one of {', '.join(providers)})"
        )
    row = providers[kind]
    _no_unknown(raw, _PROVIDER_KEYS | row.keys, "provider")
    state_dir = raw.get("state_dir", "")
    if not isinstance(state_dir, str):
        raise ConfigError(f"provider.state_dir: expected a string, got {state_dir!r}")
    settings = None
    if row.section:
        parse = cast("SectionParser", pkgutil.resolve_name(row.section))
        settings = parse(raw, types_raw)
    options = {k: v for k, v in raw.items() if k not in ("type", "state_dir")}
    return ProviderConfig(str(kind), state_dir, options, settings)


def _node_type(
    name: str, raw: Any, is_head: bool, default_max: int, detected: Mapping[str, float] | None
) -> NodeTypeConfig:
    """``default_max``: Ray's default for a type without ``max_workers`` (the cluster's
    ``max_workers`` for a worker type, 0 for the head); ``detected``: what the provider's
    cloud describes for it (None = nothing was asked)."""
    where = f"available_node_types.{name}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    _no_unknown(raw, _NODE_TYPE_KEYS, where)
    resources = raw.get("resources", {})
    if resources is None:
        resources = {}
    if not isinstance(resources, Mapping):
        raise ConfigError(f"{where}.resources: expected a mapping")
    if detected is not None:
        resources = node_resources.merged(detected, resources, is_head=is_head)
    res = {str(k): _number(v, f"{where}.resources.{k}") for k, v in resources.items()}
    min_w = _int(raw.get("min_workers", 0), f"{where}.min_workers")
    max_w = _int(raw.get("max_workers", default_max), f"{where}.max_workers")
    if min_w > max_w:
        raise ConfigError(f"{where}: min_workers {min_w} > max_workers {max_w}")
    labels = raw.get("labels", {}) or {}
    if not isinstance(labels, Mapping):
        raise ConfigError(f"{where}.labels: expected a mapping")
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"{where}.priority: expected an integer, got {priority!r}")
    idle = raw.get("idle_timeout_s")
    return NodeTypeConfig(
        name=name,
        resources=res,
        min_workers=min_w,
        max_workers=max_w + (1 if is_head else 0),
        labels={str(k): str(v) for k, v in labels.items()},
        priority=priority,
        idle_timeout_s=None if idle is None else _number(idle, f"{where}.idle_timeout_s"),
        launch_config_hash=str(raw.get("launch_config_hash", "")),
        ippr=_ippr(raw.get("ippr"), f"{where}.ippr", res),
    )


def _budget(value: Any, where: str) -> dict[str, Any]:
    """``2`` nodes or ``"20%"`` of the workers (Karpenter's ``budgets[].nodes`` form)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            percent = float(value.strip()[:-1])
        except ValueError:
            raise ConfigError(f"{where}: expected a count or a percentage, got {value!r}") from None
        if not 0 < percent <= 100 or math.isnan(percent):
            raise ConfigError(f"{where}: a percentage must be in (0, 100], got {value!r}")
        return {"disruption_budget_percent": percent}
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a count >= 1 or a percentage like '20%'")
    return {"disruption_budget_nodes": value}


def _disruption(raw: Any) -> dict[str, Any]:
    """``disruption:`` -> the scheduler options it sets."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("disruption: expected a mapping")
    _no_unknown(raw, frozenset({"budget", "do_not_disrupt_label"}), "disruption")
    out: dict[str, Any] = {}
    if raw.get("budget") is not None:
        out.update(_budget(raw["budget"], "disruption.budget"))
    label = raw.get("do_not_disrupt_label")
    if label is not None:
        if not isinstance(label, str) or not label.strip():
            raise ConfigError("disruption.do_not_disrupt_label: expected a label name")
        out["do_not_disrupt_label"] = label.strip()
    return out


def _capacity_backoff(raw: Any) -> CapacityBackoff:
    if raw is None:
        return CapacityBackoff()
    if not isinstance(raw, Mapping):
        raise ConfigError("capacity_backoff: expected a mapping")
    _no_unknown(raw, frozenset({"initial_s", "max_s", "factor"}), "capacity_backoff")
    default = CapacityBackoff()
    initial = _number(raw.get("initial_s", default.initial_s), "capacity_backoff.initial_s")
    most = _number(raw.get("max_s", max(default.max_s, initial)), "capacity_backoff.max_s")
    factor = _number(raw.get("factor", default.factor), "capacity_backoff.factor", minimum=1)
    if most < initial:
        raise ConfigError(f"capacity_backoff: max_s {most:g} < initial_s {initial:g}")
    if math.isinf(most):
        raise ConfigError("capacity_backoff.max_s: must be finite")
    return CapacityBackoff(initial, most, factor)


def _row(raw: Any, providers: Registry) -> ProviderRow:
    provider = raw.get("provider") if isinstance(raw, Mapping) else None
    kind = provider.get("type", "local") if isinstance(provider, Mapping) else "local"
    if not isinstance(kind, str) or kind not in providers:
        return ProviderRow("", "")  # provider_config names the bad type
    return providers[kind]


def with_defaults(raw: Any, providers: Registry = PROVIDERS) -> Mapping[Any, Any]:
    """The YAML under its provider's defaults (the row's ``defaults``: Ray's
    ``defaults.yaml``), top-level keys, the YAML's winning (Ray's ``fillout_defaults``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("cluster config: expected a mapping at the top level")
    row = _row(raw, providers)
    if not row.defaults:
        return raw
    defaults = cast("Callable[[], Mapping[str, Any]]", pkgutil.resolve_name(row.defaults))()
    return {**defaults, **raw}


def parse_cluster_config(
    raw: Any,
    options: Options | None = None,
    *,
    providers: Registry = PROVIDERS,
    detected: Mapping[str, Mapping[str, float]] | None = None,
) -> ClusterConfig:
    """``providers``: the provider types this build knows (the registry); ``detected``: the
    resources the provider's cloud describes per node type (:func:`resolve_cluster_config`
    asks for them)."""
    return _parse(raw, options, providers, detected, require_resources=True)


def _parse(
    given: Any,
    options: Options | None,
    providers: Registry,
    detected: Mapping[str, Mapping[str, float]] | None,
    *,
    require_resources: bool,
) -> ClusterConfig:
    if not isinstance(given, Mapping):
        raise ConfigError("cluster config: expected a mapping at the top level")
    _no_unknown(given, _TOP_KEYS, "")
    raw = with_defaults(given, providers)
    types_raw = raw.get("available_node_types")
    if not isinstance(types_raw, Mapping) or not types_raw:
        raise ConfigError("available_node_types: expected a non-empty mapping")
    if len(types_raw) == 1 and raw.get("head_node_type") is None:
        head = next(iter(types_raw))
    else:
        head = raw.get("head_node_type")
        if head not in types_raw:
            raise ConfigError(f"head_node_type: {head!r} is not in available_node_types")
    max_workers = raw.get("max_workers")
    cap = None if max_workers is None else _int(max_workers, "max_workers") + 1
    worker_max = 0 if cap is None else cap - 1
    types = {
        str(n): _node_type(
            str(n),
            t,
            n == head,
            0 if n == head else worker_max,
            None if detected is None else detected.get(str(n), {}),
        )
        for n, t in types_raw.items()
    }
    launcher_types = {
        str(n): node_type_launcher(t, f"available_node_types.{n}") for n, t in types_raw.items()
    }
    min_sum = sum(t.min_workers for t in types.values())
    if cap is not None and min_sum > cap - 1:
        raise ConfigError(
            f"max_workers: {cap - 1} is less than the node types' min_workers ({min_sum})"
        )
    idle_min = raw.get("idle_timeout_minutes")
    idle = None if idle_min is None else _number(idle_min, "idle_timeout_minutes") * 60
    speed = _number(raw.get("upscaling_speed", 0.0), "upscaling_speed")
    opts = replace(options or Options(), **_disruption(raw.get("disruption")))
    sched = SchedulerConfig(node_types=types, max_num_nodes=cap, idle_timeout_s=idle, options=opts)
    name = raw.get("cluster_name", "default")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"cluster_name: expected a non-empty string, got {name!r}")
    if "min_workers" in raw:
        _int(raw["min_workers"], "min_workers")
    provider = provider_config(raw.get("provider"), types_raw, providers)
    row = providers[provider.type]
    if require_resources:
        _resources_given(types_raw, types, head, row, asked=detected is not None)
    unused = unused_keys(
        given,
        provider_keys_used=row.keys | {"type", "state_dir"},
        launcher_keys=row.launcher_keys,
        ours=_OUR_TOP_KEYS,
        node_type_ours=_OUR_NODE_TYPE_KEYS,
    )
    warnings = (
        (
            f"keys of Ray's cluster launcher not acted on here (provider.type "
            f"{provider.type}): {', '.join(unused)}",
        )
        if unused
        else ()
    )
    return ClusterConfig(
        scheduler=sched,
        head_node_type=str(head),
        upscaling_speed=speed,
        provider=provider,
        cluster_name=name,
        capacity_backoff=_capacity_backoff(raw.get("capacity_backoff")),
        launcher=launcher(raw, launcher_types),
        warnings=warnings,
    )


def _resources_given(
    types_raw: Mapping[Any, Any],
    types: Mapping[str, NodeTypeConfig],
    head: Any,
    row: ProviderRow,
    *,
    asked: bool,
) -> None:
    """A node type the autoscaler may launch has resources: given, or found by the row's
    ``node_type_resources`` (``asked``: it was); otherwise one line naming the type."""
    for name, node in types.items():
        launches = node.max_workers - (1 if name == str(head) else 0)
        if node.resources or launches <= 0:
            continue
        where = f"available_node_types.{name}.resources"
        if row.node_type_resources and not asked:
            raise ConfigError(
                f"{where}: empty; provider.type {row.type} finds them from node_config when "
                "the config is resolved (resolve_cluster_config)"
            )
        if row.node_type_resources:
            if not types_raw[name].get("node_config"):
                raise ConfigError(f"{where}: empty, and no node_config to find them from")
            raise ConfigError(
                f"{where}: empty, and provider.type {row.type} described none for its node_config"
            )
        raise ConfigError(
            f"{where}: empty; provider.type {row.type} cannot find a node type's resources "
            "from its node_config: write them out (e.g. {CPU: 4, memory: 17179869184})"
        )


async def resolve_cluster_config(
    raw: Any, options: Options | None = None, *, providers: Registry = PROVIDERS
) -> ClusterConfig:
    """The cluster config as Ray reads it: each node type's resources filled in from its
    provider's description of the instance (the row's ``node_type_resources``), the YAML's
    own ``resources`` keys winning."""
    cluster = _parse(raw, options, providers, None, require_resources=False)
    row = providers[cluster.provider.type]
    if not row.node_type_resources:
        return _parse(raw, options, providers, None, require_resources=True)
    own = cluster.launcher.node_types
    node_configs = {name: t.node_config for name, t in own.items() if t.node_config}
    fill = cast("node_resources.NodeTypeResources", pkgutil.resolve_name(row.node_type_resources))
    section = with_defaults(raw, providers).get("provider") or {}
    try:
        found = await fill(section, node_configs)
    except ConfigError:
        raise
    except Exception as exc:  # the cloud's own error, as one line
        raise ConfigError(
            f"provider.type {row.type}: cannot read the node types' resources ({exc})"
        ) from exc
    detected = node_resources.checked(found, row.type, node_configs)
    return _parse(raw, options, providers, detected, require_resources=True)


def _read_yaml(path: str | Path) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{at} malformed YAML") from exc


def load_cluster_config(
    path: str | Path, options: Options | None = None, *, providers: Registry = PROVIDERS
) -> ClusterConfig:
    """The YAML's resources as written (see :func:`load_resolved_cluster_config`)."""
    raw = _read_yaml(path)
    try:
        return parse_cluster_config(raw, options, providers=providers)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


async def load_resolved_cluster_config(
    path: str | Path, options: Options | None = None, *, providers: Registry = PROVIDERS
) -> ClusterConfig:
    """The YAML read as Ray reads it (:func:`resolve_cluster_config`)."""
    raw = _read_yaml(path)
    try:
        return await resolve_cluster_config(raw, options, providers=providers)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def with_options(cfg: ClusterConfig, options: Options) -> ClusterConfig:
    return replace(cfg, scheduler=replace(cfg.scheduler, options=options))
