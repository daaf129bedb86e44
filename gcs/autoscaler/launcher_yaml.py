"""The keys of Ray's cluster-launcher YAML (``ray-schema.json`` of Ray 2.60) and what the
autoscaler keeps of the ones it does not schedule with.

Every key Ray's schema accepts is accepted; a key it does not know is an error, and the
error names all of them.  The launcher keys (setup and start commands, Docker, file mounts,
SSH) are checked as Ray checks them and recorded in :class:`Launcher`, which a provider that
starts machines reads (its row's ``launcher_keys`` says which it acts on); the keys nothing
here acts on are named once, all together, in one warning (:func:`unused_keys`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A cluster config that cannot be used; the message names the offending place."""


# ray-schema.json (Ray 2.60): the top level, `auth`, `docker` and a node type's `docker`
# are closed; `provider` is open in Ray, closed here to Ray's listed keys plus the row's.
RAY_TOP_KEYS = frozenset(
    {
        "cluster_name", "max_workers", "upscaling_speed", "idle_timeout_minutes", "provider",
        "auth", "docker", "head_node_type", "file_mounts", "cluster_synced_files",
        "file_mounts_sync_continuously", "rsync_exclude", "rsync_filter", "metadata",
        "initialization_commands", "setup_commands", "head_setup_commands",
        "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
        "no_restart", "available_node_types",
    }
)  # fmt: skip
# Ray drops these before validating (``fillout_defaults``): the legacy cluster-wide
# ``min_workers``, and ``head_node`` / ``worker_nodes`` when empty.
RAY_LEGACY_TOP_KEYS = frozenset({"min_workers", "head_node", "worker_nodes"})
RAY_NODE_TYPE_KEYS = frozenset(
    {
        "node_config", "min_workers", "max_workers", "idle_timeout_s", "priority",
        "resources", "labels", "initialization_commands", "worker_setup_commands", "docker",
    }
)  # fmt: skip
RAY_PROVIDER_KEYS = frozenset(
    {
        "type", "region", "module", "head_ip", "worker_ips", "use_internal_ips", "namespace",
        "location", "resource_group", "tags", "subscription_id", "msi_identity_id",
        "msi_identity_principal_id", "subnet_id", "autoscaler_service_account",
        "autoscaler_role", "autoscaler_role_binding", "cache_stopped_nodes",
        "availability_zone", "project_id", "security_group", "disable_node_updaters",
        "gcp_credentials", "cloudwatch",
        # read by Ray's launcher though not listed in its schema
        "disable_launch_config_check", "foreground_node_launch",
    }
)  # fmt: skip
DOCKER_KEYS = frozenset(
    {
        "image", "container_name", "pull_before_run", "run_options", "head_image",
        "head_run_options", "worker_image", "worker_run_options",
        "disable_automatic_runtime_detection", "disable_shm_size_detection", "use_podman",
    }
)  # fmt: skip
NODE_TYPE_DOCKER_KEYS = frozenset({"pull_before_run", "worker_image", "worker_run_options"})
AUTH_KEYS = frozenset(
    {"ssh_user", "ssh_public_key", "ssh_private_key", "ssh_proxy_command", "ssh_proxy_use_node_id"}
)

# What the autoscaler itself schedules with (the rest is the launcher's).
ACTED_TOP_KEYS = frozenset(
    {
        "cluster_name", "max_workers", "upscaling_speed", "idle_timeout_minutes", "provider",
        "available_node_types", "head_node_type",
    }
)  # fmt: skip
ACTED_NODE_TYPE_KEYS = frozenset(
    {"node_config", "resources", "min_workers", "max_workers", "labels", "priority",
     "idle_timeout_s"}
)  # fmt: skip
COMMAND_KEYS = (
    "initialization_commands", "setup_commands", "head_setup_commands",
    "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
)  # fmt: skip


def no_unknown(raw: Mapping[Any, Any], allowed: Iterable[str], where: str) -> None:
    """Every key of ``raw`` outside ``allowed``, all named in one error."""
    allowed = frozenset(allowed)
    unknown = sorted(str(k) for k in raw if str(k) not in allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        names = ", ".join(prefix + key for key in unknown)
        raise ConfigError(f"{names}: unknown key{'s' if len(unknown) > 1 else ''}")


def _commands(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list of shell commands, got {raw!r}")
    for i, cmd in enumerate(raw):
        if not isinstance(cmd, str):
            raise ConfigError(f"{where}[{i}]: expected a shell command (a string), got {cmd!r}")
    return tuple(raw)


def _strings(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise ConfigError(f"{where}: expected a list of strings, got {raw!r}")
    return tuple(raw)


def _mapping(raw: Any, where: str) -> Mapping[Any, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    return raw


def _bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(f"{where}: expected true or false, got {raw!r}")
    return raw


def _docker(raw: Any, where: str, keys: frozenset[str]) -> dict[str, Any]:
    docker = _mapping(raw, where)
    no_unknown(docker, keys, where)
    out: dict[str, Any] = {}
    for key, value in docker.items():
        at = f"{where}.{key}"
        if key.endswith("run_options"):
            out[key] = _strings(value, at)
        elif key in ("image", "container_name", "head_image", "worker_image"):
            if not isinstance(value, str):
                raise ConfigError(f"{at}: expected a string, got {value!r}")
            out[key] = value
        else:
            out[key] = _bool(value, at)
    return out


def _auth(raw: Any) -> dict[str, Any]:
    auth = _mapping(raw, "auth")
    no_unknown(auth, AUTH_KEYS, "auth")
    for key, value in auth.items():
        if key == "ssh_proxy_use_node_id":
            _bool(value, f"auth.{key}")
        elif not isinstance(value, str):
            raise ConfigError(f"auth.{key}: expected a string, got {value!r}")
    if auth.get("ssh_proxy_use_node_id") and "ssh_proxy_command" not in auth:
        raise ConfigError("auth.ssh_proxy_command: required when ssh_proxy_use_node_id is true")
    return dict(auth)


@dataclass(frozen=True)
class NodeTypeLauncher:
    """A node type's own launcher keys; each replaces the cluster-wide one (Ray's rule)."""

    node_config: Mapping[str, Any] = field(default_factory=dict)
    initialization_commands: tuple[str, ...] | None = None
    worker_setup_commands: tuple[str, ...] | None = None
    docker: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Launcher:
    """What Ray's ``ray up`` reads beside the autoscaler's own keys, checked and kept for the
    providers that start machines (setup and start commands, Docker, file mounts, SSH)."""

    initialization_commands: tuple[str, ...] = ()
    setup_commands: tuple[str, ...] = ()
    head_setup_commands: tuple[str, ...] = ()
    worker_setup_commands: tuple[str, ...] = ()
    head_start_ray_commands: tuple[str, ...] = ()
    worker_start_ray_commands: tuple[str, ...] = ()
    docker: Mapping[str, Any] | None = None
    """None: no ``docker`` key (the node types' own are then unused, as in Ray)."""
    auth: Mapping[str, Any] = field(default_factory=dict)
    file_mounts: Mapping[str, str] = field(default_factory=dict)
    cluster_synced_files: tuple[str, ...] = ()
    file_mounts_sync_continuously: bool = False
    rsync_exclude: tuple[str, ...] = ()
    rsync_filter: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    node_types: Mapping[str, NodeTypeLauncher] = field(default_factory=dict)

    def _own(self, node_type: str) -> NodeTypeLauncher:
        return self.node_types.get(node_type) or NodeTypeLauncher()

    def worker_setup(self, node_type: str) -> tuple[str, ...]:
        """A worker's setup: its type's ``worker_setup_commands`` if given, else
        ``setup_commands + worker_setup_commands`` (Ray's ``merge_setup_commands``)."""
        own = self._own(node_type).worker_setup_commands
        return own if own is not None else self.setup_commands + self.worker_setup_commands

    def head_setup(self) -> tuple[str, ...]:
        return self.setup_commands + self.head_setup_commands

    def initialization(self, node_type: str) -> tuple[str, ...]:
        own = self._own(node_type).initialization_commands
        return own if own is not None else self.initialization_commands

    def docker_for(self, node_type: str) -> dict[str, Any]:
        """The cluster's ``docker`` updated with the type's own (Ray's rule); {} without a
        cluster ``docker``."""
        if self.docker is None:
            return {}
        return {**self.docker, **self._own(node_type).docker}


def node_type_launcher(raw: Mapping[Any, Any], where: str) -> NodeTypeLauncher:
    node_config = raw.get("node_config")
    if node_config is not None and not isinstance(node_config, Mapping):
        raise ConfigError(f"{where}.node_config: expected a mapping, got {node_config!r}")
    init, setup = raw.get("initialization_commands"), raw.get("worker_setup_commands")
    return NodeTypeLauncher(
        node_config=dict(node_config or {}),
        initialization_commands=(
            None if init is None else _commands(init, f"{where}.initialization_commands")
        ),
        worker_setup_commands=(
            None if setup is None else _commands(setup, f"{where}.worker_setup_commands")
        ),
        docker=_docker(raw.get("docker"), f"{where}.docker", NODE_TYPE_DOCKER_KEYS),
    )


def launcher(raw: Mapping[Any, Any], node_types: Mapping[str, NodeTypeLauncher]) -> Launcher:
    """The launcher keys of a cluster YAML, each checked (errors name the field)."""
    commands = {key: _commands(raw.get(key), key) for key in COMMAND_KEYS}
    mounts = _mapping(raw.get("file_mounts"), "file_mounts")
    for remote, local in mounts.items():
        if not isinstance(remote, str) or not isinstance(local, str):
            raise ConfigError(f"file_mounts.{remote}: expected remote path: local path")
    sync = raw.get("file_mounts_sync_continuously", False)
    for key in ("head_node", "worker_nodes"):  # Ray >= 2.0 drops them only when empty
        if raw.get(key):
            raise ConfigError(f"{key}: the legacy form is not read here; use available_node_types")
    return Launcher(
        **commands,
        docker=_docker(raw.get("docker"), "docker", DOCKER_KEYS) if "docker" in raw else None,
        auth=_auth(raw.get("auth")),
        file_mounts=dict(mounts),
        cluster_synced_files=_strings(raw.get("cluster_synced_files"), "cluster_synced_files"),
        file_mounts_sync_continuously=_bool(sync, "file_mounts_sync_continuously"),
        rsync_exclude=_strings(raw.get("rsync_exclude"), "rsync_exclude"),
        rsync_filter=_strings(raw.get("rsync_filter"), "rsync_filter"),
        metadata=dict(_mapping(raw.get("metadata"), "metadata")),
        node_types=dict(node_types),
    )


def unused_keys(
    raw: Mapping[Any, Any],
    *,
    provider_keys_used: frozenset[str],
    launcher_keys: frozenset[str],
    ours: frozenset[str],
    node_type_ours: frozenset[str],
) -> list[str]:
    """The keys of the YAML as written that nothing here acts on, by their path:
    launcher keys the provider does not act on (``launcher_keys``: top-level names, and
    ``available_node_types.*.<key>`` for a node type's), provider keys outside its row."""
    used_top = ACTED_TOP_KEYS | ours | launcher_keys
    out = [str(k) for k in raw if str(k) not in used_top]
    provider = raw.get("provider")
    if isinstance(provider, Mapping):
        out += [f"provider.{k}" for k in provider if str(k) not in provider_keys_used]
    types = raw.get("available_node_types")
    if isinstance(types, Mapping):
        used = ACTED_NODE_TYPE_KEYS | node_type_ours
        prefix = "available_node_types.*."
        used |= {k[len(prefix) :] for k in launcher_keys if k.startswith(prefix)}
        for name, node in types.items():
            if isinstance(node, Mapping):
                out += [f"available_node_types.{name}.{k}" for k in node if str(k) not in used]
    return out
