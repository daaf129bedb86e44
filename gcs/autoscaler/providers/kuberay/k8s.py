"""The Kubernetes API calls of the KubeRay provider, on the official ``kubernetes`` client.

The client is synchronous; each call runs in a worker thread.  Objects stay plain dicts (the
API's JSON) so the pure modules read them as Ray's provider does.  Patch content types are
always set explicitly: the client would send a JSON-patch list to a custom resource as a
merge patch, which the server rejects.  API failures become :class:`KubeApiError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from typing import Any, Protocol

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"


class KubeApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status
        self.message = message

    @property
    def conflict(self) -> bool:
        """Someone else changed the object first (stale resourceVersion or failed test op)."""
        return self.status == 409 or (self.status == 422 and "testing value" in self.message)


class KubeApi(Protocol):
    """What the provider needs from Kubernetes, for one RayCluster."""

    namespace: str
    cluster_name: str

    async def get_cluster(self) -> dict[str, Any]: ...

    async def json_patch_cluster(self, ops: list[dict[str, Any]]) -> dict[str, Any]: ...

    async def merge_patch_cluster(self, patch: dict[str, Any]) -> dict[str, Any]: ...

    async def delete_cluster(self) -> None: ...

    async def list_pods(self) -> list[dict[str, Any]]: ...

    async def patch_pod_annotations(self, pod: str, annotations: dict[str, str]) -> None: ...

    async def resize_pod(self, pod: str, ops: list[dict[str, Any]]) -> dict[str, Any]: ...


SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def load_client_config() -> tuple[Any, str]:
    """In-cluster service account, else ``KUBECONFIG`` / ``~/.kube/config``; returns the
    client and the default namespace (the service account's, else the context's)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
        with open(SA_NAMESPACE) as f:
            return client.ApiClient(), f.read().strip() or "default"
    except config.ConfigException:
        pass
    # KUBECONFIG read now (the client reads it once, when it is first imported)
    path = os.environ.get("KUBECONFIG") or None
    config.load_kube_config(config_file=path)
    try:
        _, active = config.list_kube_config_contexts(config_file=path)
        namespace = (active or {}).get("context", {}).get("namespace") or "default"
    except config.ConfigException:
        namespace = "default"
    return client.ApiClient(), str(namespace)


class KubernetesApi:
    def __init__(
        self, api_client: Any, namespace: str, cluster_name: str, *, timeout_s: float = 30.0
    ) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.cluster_name = cluster_name
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._timeout_s = timeout_s

    async def _run(self, fn: Callable[[], Any]) -> Any:
        from kubernetes.client.exceptions import ApiException

        def call() -> Any:
            try:
                return fn()
            except ApiException as err:
                message = err.reason or ""
                with contextlib.suppress(ValueError):
                    message = json.loads(err.body or "{}").get("message") or message
                raise KubeApiError(int(err.status or 0), str(message)) from None

        return await asyncio.to_thread(call)

    def _cluster_args(self) -> dict[str, Any]:
        return {
            "group": GROUP,
            "version": VERSION,
            "namespace": self.namespace,
            "plural": PLURAL,
            "name": self.cluster_name,
            "_request_timeout": self._timeout_s,
        }

    async def get_cluster(self) -> dict[str, Any]:
        args = self._cluster_args()
        return await self._run(lambda: self._custom.get_namespaced_custom_object(**args))

    async def json_patch_cluster(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        args = self._cluster_args()
        return await self._run(
            lambda: self._custom.patch_namespaced_custom_object(
                body=ops, _content_type=JSON_PATCH, **args
            )
        )

    async def merge_patch_cluster(self, patch: dict[str, Any]) -> dict[str, Any]:
        args = self._cluster_args()
        return await self._run(
            lambda: self._custom.patch_namespaced_custom_object(
                body=patch, _content_type=MERGE_PATCH, **args
            )
        )

    async def delete_cluster(self) -> None:
        args = self._cluster_args()
        await self._run(lambda: self._custom.delete_namespaced_custom_object(**args))

    async def list_pods(self) -> list[dict[str, Any]]:
        def call() -> Any:
            resp = self._core.list_namespaced_pod(
                self.namespace,
                label_selector=f"ray.io/cluster={self.cluster_name}",
                _preload_content=False,
                _request_timeout=self._timeout_s,
            )
            return json.loads(resp.data).get("items") or []  # type: ignore[attr-defined]

        return await self._run(call)

    async def patch_pod_annotations(self, pod: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        await self._run(
            lambda: self._core.patch_namespaced_pod(
                pod,
                self.namespace,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout_s,
            )
        )

    async def resize_pod(self, pod: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        def call() -> Any:
            resp = self._core.patch_namespaced_pod_resize(
                pod,
                self.namespace,
                ops,
                _content_type=JSON_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout_s,
            )
            return json.loads(resp.data)  # type: ignore[attr-defined]

        return await self._run(call)
