"""The KubeRay row's own config and I/O: its ``provider:`` keys (``cluster_name``,
``namespace``), the Kubernetes API client built from them, and the cluster config read from
the RayCluster (``gcs autoscaler run --provider kuberay`` has no YAML).

Credentials are the pod's service account, else ``KUBECONFIG`` / ``~/.kube/config``
(:func:`~gcs.autoscaler.providers.kuberay.k8s.load_client_config`); the namespace, when the
section names none, is the service account's, else the kubeconfig context's, else
``default``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from gcs.autoscaler.config import ClusterConfig, ConfigError, ProviderConfig
from gcs.autoscaler.providers.kuberay.cluster import cluster_config
from gcs.autoscaler.providers.kuberay.ippr import parse_ippr
from gcs.autoscaler.providers.kuberay.k8s import KubeApi, KubeApiError
from gcs.policy.autoscaling.scheduler.types import Options

__all__ = ["KubeRaySection", "connect", "initial_config", "read_cluster", "section"]


@dataclass(frozen=True, slots=True)
class KubeRaySection:
    cluster_name: str
    """The RayCluster's name."""
    namespace: str | None = None
    """Its namespace (None: from the credentials, see the module docstring)."""


def section(raw: Mapping[str, Any], types_raw: Mapping[Any, Any]) -> KubeRaySection:
    """The registry row's section parser."""
    name = raw.get("cluster_name")
    if not isinstance(name, str) or not name:
        raise ConfigError("provider.cluster_name: required for provider type kuberay")
    namespace = raw.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise ConfigError(f"provider.namespace: expected a namespace name, got {namespace!r}")
    return KubeRaySection(name, namespace)


def connect(settings: KubeRaySection) -> KubeApi:
    """A client of the API server for the section's RayCluster (no request is made yet)."""
    from gcs.autoscaler.providers.kuberay.k8s import KubernetesApi, load_client_config

    try:
        client, default_ns = load_client_config()
    except Exception as err:  # no service account and no usable kubeconfig
        raise ConfigError(f"cannot load Kubernetes credentials: {err}") from None
    return KubernetesApi(client, settings.namespace or default_ns, settings.cluster_name)


async def initial_config(api: KubeApi, options: Options | None = None) -> ClusterConfig:
    """The RayCluster's config before the first round (the runtime is built from it)."""
    cr = await api.get_cluster()
    pods = await api.list_pods()
    running = Counter(
        labels.get("ray.io/group", "")
        for labels in ((p.get("metadata") or {}).get("labels") or {} for p in pods)
        if labels.get("ray.io/node-type") == "worker"
    )
    return cluster_config(cr, parse_ippr(cr), running, options)


async def read_cluster(provider: ProviderConfig, options: Options | None = None) -> ClusterConfig:
    """The registry row's cloud config reader: connect, then read the RayCluster."""
    api = connect(cast("KubeRaySection", provider.settings))
    where = f"RayCluster {api.namespace}/{api.cluster_name}"
    try:
        return await initial_config(api, options)
    except KubeApiError as err:
        raise ConfigError(f"{where}: {err.message or err}") from None
    except (ConfigError, OSError) as err:
        raise ConfigError(f"{where}: {err}") from None
