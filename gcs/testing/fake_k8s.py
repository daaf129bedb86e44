"""An in-process fake Kubernetes API server over HTTP, for the KubeRay provider.

It serves what the provider uses, as strictly as the real server does:

- ``ray.io/v1`` RayCluster get / patch / delete.  JSON patch (``application/json-patch+json``,
  a failed ``test`` op is a 422) and merge patch (a list body is a 400, the Python client's
  trap); strategic merge on a custom resource is a 415; a stale ``metadata.resourceVersion``
  is a 409; unknown fields in the result are a 400 (strict field validation).
- pods list (``labelSelector`` ``k=v,k2=v2``) / get / patch (metadata only) and the
  ``resize`` subresource (only ``spec.containers[*].resources`` cpu/memory may change).

It plays the operator (after every RayCluster change, pods follow ``replicas`` kept within
``minReplicas``/``maxReplicas``, and ``scaleStrategy.workersToDelete``; a head pod always
runs) and the kubelet (each resize
completes, stays ``PodResizePending`` or fails, as a test scripts it with
:meth:`FakeKubernetes.script_resize`; completion updates ``status.containerStatuses[].
resources``).  ``on_pod_created`` / ``on_pod_deleted`` let a test stand real processes in for
pods.  Runs a :class:`~gcs.testing.http_server.QuietHTTPServer` in a daemon thread; one lock
guards the state.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from gcs.testing.http_server import QuietHTTPServer
from gcs.testing.k8s_patch import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    ApiError,
    patched,
)

__all__ = ["ApiError", "FakeKubernetes", "ResizeOutcome"]


_CLUSTER_SPEC_KEYS = frozenset(
    {
        "rayVersion", "enableInTreeAutoscaling", "autoscalerOptions", "headGroupSpec",
        "workerGroupSpecs", "headServiceAnnotations", "suspend", "idleSuspend",
        "idleTerminationOptions", "managedBy", "gcsFaultToleranceOptions", "upgradeStrategy",
    }
)  # fmt: skip
_GROUP_KEYS = frozenset(
    {
        "groupName", "replicas", "minReplicas", "maxReplicas", "numOfHosts", "rayStartParams",
        "template", "scaleStrategy", "suspend", "idleTimeoutSeconds", "serviceAccountName",
    }
)  # fmt: skip
_TOP_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


@dataclass(frozen=True)
class ResizeOutcome:
    """What the kubelet does with the next resize of a pod.

    ``kind``: ``complete`` (applied at once), ``deferred`` / ``infeasible``
    (``PodResizePending`` with ``message``), ``inprogress`` (``PodResizeInProgress``, held
    until :meth:`FakeKubernetes.finish_resize`), ``error`` (``PodResizeInProgress`` reason
    Error with ``message``).
    """

    kind: str = "complete"
    message: str = ""


class FakeKubernetes:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.RLock()
        self._rv = itertools.count(1000)
        self._names = itertools.count(1)
        self.clusters: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str]] = []
        """(method, path, content type) of every request, for assertions."""
        self._scripts: dict[str, list[ResizeOutcome]] = {}
        self.default_outcome = ResizeOutcome()
        self.grace_deletes = False
        """When set, deleted pods keep a ``deletionTimestamp`` until :meth:`finish_deletions`."""
        self._deleted: list[dict[str, Any]] = []
        self.on_pod_created: Callable[[dict[str, Any]], None] | None = None
        self.on_pod_deleted: Callable[[dict[str, Any]], None] | None = None
        self.fail_next: dict[str, ApiError] = {}
        """``"METHOD path-suffix"`` -> error answered once (e.g. a 500 on a pod patch)."""
        self._server = QuietHTTPServer((host, 0), _handler(self))
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeKubernetes:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """A kubeconfig pointing at this server (what ``KUBECONFIG`` names)."""
        path = Path(path)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(doc))
        return path

    # -- test controls --------------------------------------------------------------------
    def add_raycluster(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = copy.deepcopy(dict(raw))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta["resourceVersion"] = self._next_rv()
        meta.setdefault("uid", f"uid-{next(self._names)}")
        obj.setdefault("apiVersion", "ray.io/v1")
        obj.setdefault("kind", "RayCluster")
        _check_cluster_fields(obj)
        created: list[dict[str, Any]] = []
        with self._lock:
            self.clusters[(meta["namespace"], meta["name"])] = obj
            created = self._operate(obj)
        self._notify(created, [])
        return copy.deepcopy(obj)

    def edit_raycluster(
        self, name: str, edit: Callable[[dict[str, Any]], None], namespace: str = "default"
    ) -> None:
        """Change a RayCluster as a user would (kubectl edit): bumps resourceVersion."""
        with self._lock:
            obj = self.clusters[(namespace, name)]
            edit(obj)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            created = self._operate(obj)
        self._notify(created, [])

    def raycluster(self, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.clusters[(namespace, name)])

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.pods[(namespace, name)])

    def pod_names(self, group: str | None = None, namespace: str = "default") -> list[str]:
        with self._lock:
            return sorted(
                p["metadata"]["name"]
                for (ns, _), p in self.pods.items()
                if ns == namespace
                and (group is None or p["metadata"]["labels"].get("ray.io/group") == group)
            )

    def script_resize(self, pod: str, *outcomes: ResizeOutcome) -> None:
        """The next resizes of ``pod`` end as listed (then ``default_outcome``)."""
        with self._lock:
            self._scripts.setdefault(pod, []).extend(outcomes)

    def finish_resize(self, pod: str, namespace: str = "default") -> None:
        """The kubelet completes the resize in flight on ``pod``."""
        with self._lock:
            p = self.pods[(namespace, pod)]
            _complete_resize(p)
            p["metadata"]["resourceVersion"] = self._next_rv()

    def finish_deletions(self) -> None:
        """Pods being deleted (grace period) go away."""
        gone = []
        with self._lock:
            for key, p in list(self.pods.items()):
                if p["metadata"].get("deletionTimestamp"):
                    gone.append(self.pods.pop(key))
        self._notify([], gone)

    # -- operator -------------------------------------------------------------------------
    def _operate(self, cluster: dict[str, Any]) -> list[dict[str, Any]]:
        """Pods follow the spec (lock held).  Returns created pods; deleted ones are queued."""
        meta, spec = cluster["metadata"], cluster.get("spec", {})
        ns, name = meta["namespace"], meta["name"]
        created: list[dict[str, Any]] = []
        mine = {
            k: p
            for k, p in self.pods.items()
            if k[0] == ns and p["metadata"]["labels"].get("ray.io/cluster") == name
        }
        if spec.get("suspend") or spec.get("idleSuspend"):
            for key in mine:
                self._delete_pod(key)
            return created
        heads = [p for p in mine.values() if p["metadata"]["labels"]["ray.io/node-type"] == "head"]
        head_spec = spec.get("headGroupSpec")
        if not heads and head_spec is not None:
            created.append(self._create_pod(cluster, "headgroup", "head", head_spec))
        for group in spec.get("workerGroupSpecs", []):
            gname = group["groupName"]
            to_delete = set(group.get("scaleStrategy", {}).get("workersToDelete") or [])
            for key, p in mine.items():
                if p["metadata"]["name"] in to_delete and key in self.pods:
                    self._delete_pod(key)
            live = [
                p
                for k, p in self.pods.items()
                if k[0] == ns
                and p["metadata"]["labels"].get("ray.io/cluster") == name
                and p["metadata"]["labels"].get("ray.io/group") == gname
                and not p["metadata"].get("deletionTimestamp")
            ]
            want = desired_replicas(group) * int(group.get("numOfHosts", 1))
            for _ in range(max(0, want - len(live))):
                created.append(self._create_pod(cluster, gname, "worker", group))
        return created

    def _create_pod(
        self, cluster: dict[str, Any], group: str, kind: str, gspec: dict[str, Any]
    ) -> dict[str, Any]:
        meta = cluster["metadata"]
        suffix = "head" if kind == "head" else f"worker-{next(self._names):05d}"
        name = f"{meta['name']}-{group}-{suffix}" if kind == "worker" else f"{meta['name']}-head"
        template = copy.deepcopy(gspec.get("template", {}))
        pod_spec = template.get("spec", {})
        containers = pod_spec.get("containers", [])
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "uid": f"uid-{next(self._names)}",
                "resourceVersion": self._next_rv(),
                "labels": {
                    **template.get("metadata", {}).get("labels", {}),
                    "ray.io/cluster": meta["name"],
                    "ray.io/group": group,
                    "ray.io/node-type": kind,
                },
                "annotations": dict(template.get("metadata", {}).get("annotations", {})),
            },
            "spec": pod_spec,
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": c.get("name", "ray"),
                        "image": c.get("image", "rayproject/ray"),
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                        "resources": copy.deepcopy(c.get("resources", {})),
                    }
                    for c in containers
                ],
            },
        }
        self.pods[(meta["namespace"], name)] = pod
        return copy.deepcopy(pod)

    def _delete_pod(self, key: tuple[str, str]) -> None:
        pod = self.pods[key]
        if self.grace_deletes:
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        else:
            self._deleted.append(self.pods.pop(key))

    def _notify(self, created: list[dict[str, Any]], deleted: list[dict[str, Any]]) -> None:
        with self._lock:
            deleted = deleted + self._deleted
            self._deleted = []
        for p in deleted:
            if self.on_pod_deleted is not None:
                self.on_pod_deleted(p)
        for p in created:
            if self.on_pod_created is not None:
                self.on_pod_created(p)

    def _next_rv(self) -> str:
        return str(next(self._rv))

    # -- API ------------------------------------------------------------------------------
    def handle(self, method: str, url: str, ctype: str, body: Any) -> tuple[int, Any]:
        parsed = urlparse(url)
        path = parsed.path.rstrip("/")
        self.requests.append((method, path, ctype))
        for key, err in list(self.fail_next.items()):
            m, suffix = key.split(" ", 1)
            if m == method and path.endswith(suffix):
                del self.fail_next[key]
                raise err
        parts = path.strip("/").split("/")
        created: list[dict[str, Any]] = []
        with self._lock:
            if parts[:3] == ["apis", "ray.io", "v1"] and len(parts) == 7:
                status, out, created = self._cluster_call(method, (parts[4], parts[6]), ctype, body)
            elif parts[:2] == ["api", "v1"] and len(parts) == 5 and parts[4] == "pods":
                if method != "GET":
                    raise ApiError(405, "MethodNotAllowed", f"{method} not supported")
                status, out = 200, self._list_pods(parts[3], parse_qs(parsed.query))
            elif parts[:2] == ["api", "v1"] and len(parts) in (6, 7) and parts[4] == "pods":
                sub = parts[6] if len(parts) == 7 else ""
                status, out = self._pod_call(method, (parts[3], parts[5]), sub, ctype, body)
            else:
                raise ApiError(404, "NotFound", f"the server could not find {path}")
        self._notify(created, [])
        return status, out

    def _cluster_call(
        self, method: str, key: tuple[str, str], ctype: str, body: Any
    ) -> tuple[int, Any, list[dict[str, Any]]]:
        obj = self.clusters.get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f'rayclusters.ray.io "{key[1]}" not found')
        if method == "GET":
            return 200, copy.deepcopy(obj), []
        if method == "DELETE":
            if obj["metadata"].get("finalizers"):
                obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                obj["metadata"]["resourceVersion"] = self._next_rv()
            else:
                del self.clusters[key]
                for pkey in [k for k, p in self.pods.items() if _owned(p, key)]:
                    self._delete_pod(pkey)
            return 200, {"kind": "Status", "status": "Success"}, []
        if method != "PATCH":
            raise ApiError(405, "MethodNotAllowed", f"{method} not supported")
        if ctype == STRATEGIC_PATCH:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}, {MERGE_PATCH}, application/apply-patch+yaml",
            )
        new = patched(obj, ctype, body)
        _check_cluster_fields(new)
        _check_rv(obj, new)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self.clusters[key] = new
        return 200, copy.deepcopy(new), self._operate(new)

    def _list_pods(self, ns: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        want: dict[str, str] = {}
        for sel in query.get("labelSelector", []):
            for term in sel.split(","):
                if "=" not in term:
                    raise ApiError(400, "BadRequest", f"unsupported label selector {term!r}")
                k, v = term.split("=", 1)
                want[k.strip()] = v.strip().lstrip("=")
        items = [
            copy.deepcopy(p)
            for (pns, _), p in sorted(self.pods.items())
            if pns == ns and all(p["metadata"]["labels"].get(k) == v for k, v in want.items())
        ]
        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": self._next_rv()},
            "items": items,
        }

    def _pod_call(
        self, method: str, key: tuple[str, str], sub: str, ctype: str, body: Any
    ) -> tuple[int, Any]:
        pod = self.pods.get(key)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{key[1]}" not found')
        if method == "GET" and sub == "":
            return 200, copy.deepcopy(pod)
        if method != "PATCH" or sub not in ("", "resize"):
            raise ApiError(405, "MethodNotAllowed", f"{method} {sub or 'pod'} not supported")
        new = patched(pod, ctype, body)
        _check_rv(pod, new)
        if sub == "":
            _only_changed(pod, new, ("metadata",), "pod updates may only change metadata here")
        else:
            _check_resize(pod, new)
        new["metadata"]["resourceVersion"] = self._next_rv()
        if sub == "resize":
            script = self._scripts.get(key[1])
            outcome = script.pop(0) if script else self.default_outcome
            _start_resize(new, outcome)
        self.pods[key] = new
        return 200, copy.deepcopy(new)


def desired_replicas(group: Mapping[str, Any]) -> int:
    """The operator's count for a group: ``replicas`` kept within [minReplicas, maxReplicas]
    (KubeRay's ``GetWorkerGroupDesiredReplicas``; a min above the max gives the max)."""
    if group.get("suspend"):
        return 0
    low = int(group.get("minReplicas") or 0)
    high = group.get("maxReplicas")
    want = max(int(group.get("replicas") or 0), low)
    return want if high is None else min(want, int(high))


def _check_rv(old: dict[str, Any], new: dict[str, Any]) -> None:
    want = new.get("metadata", {}).get("resourceVersion")
    have = old["metadata"]["resourceVersion"]
    if want is not None and want != have:
        raise ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on "{old["metadata"]["name"]}": the object has '
            f"been modified; please apply your changes to the latest version and try again",
        )


def _check_cluster_fields(obj: dict[str, Any]) -> None:
    def unknown(where: str, keys: Any, allowed: frozenset[str]) -> None:
        for k in keys:
            if k not in allowed:
                raise ApiError(
                    400, "BadRequest", f'strict decoding error: unknown field "{where}{k}"'
                )

    unknown("", obj, _TOP_KEYS)
    spec = obj.get("spec", {})
    if not isinstance(spec, dict):
        raise ApiError(422, "Invalid", "spec: must be an object")
    unknown("spec.", spec, _CLUSTER_SPEC_KEYS)
    for i, group in enumerate(spec.get("workerGroupSpecs", [])):
        unknown(f"spec.workerGroupSpecs[{i}].", group, _GROUP_KEYS)
        strategy = group.get("scaleStrategy") or {}
        unknown(
            f"spec.workerGroupSpecs[{i}].scaleStrategy.", strategy, frozenset({"workersToDelete"})
        )
        replicas = group.get("replicas", 0)
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", f"spec.workerGroupSpecs[{i}].replicas: invalid value")


def _only_changed(
    old: dict[str, Any], new: dict[str, Any], keys: tuple[str, ...], why: str
) -> None:
    for k in set(old) | set(new):
        if k not in keys and old.get(k) != new.get(k):
            raise ApiError(422, "Invalid", f"{why} (changed {k})")


def _check_resize(old: dict[str, Any], new: dict[str, Any]) -> None:
    _only_changed(old, new, ("spec", "metadata"), "pods/resize may only change container resources")
    if old["metadata"] != new["metadata"] and {
        k: v for k, v in new["metadata"].items() if k != "resourceVersion"
    } != {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}:
        raise ApiError(422, "Invalid", "pods/resize may only change container resources")
    olds, news = old["spec"], new["spec"]
    for k in set(olds) | set(news):
        if k != "containers" and olds.get(k) != news.get(k):
            raise ApiError(422, "Invalid", f"pods/resize may not change spec.{k}")
    if len(olds.get("containers", [])) != len(news.get("containers", [])):
        raise ApiError(422, "Invalid", "pods/resize may not add or remove containers")
    for i, (a, b) in enumerate(zip(olds["containers"], news["containers"], strict=True)):
        for k in set(a) | set(b):
            if k != "resources" and a.get(k) != b.get(k):
                raise ApiError(422, "Invalid", f"spec.containers[{i}].{k}: Forbidden")
        for part in ("requests", "limits"):
            ra, rb = a.get("resources", {}).get(part, {}), b.get("resources", {}).get(part, {})
            for r in set(ra) | set(rb):
                if r not in ("cpu", "memory") and ra.get(r) != rb.get(r):
                    raise ApiError(
                        422,
                        "Invalid",
                        f"spec.containers[{i}].resources.{part}[{r}]: Forbidden: only cpu and "
                        f"memory resources are mutable",
                    )


_RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")


def _set_condition(pod: dict[str, Any], ctype: str, reason: str, message: str) -> None:
    conds = [c for c in pod["status"].get("conditions", []) if c["type"] not in _RESIZE_CONDITIONS]
    conds.append({"type": ctype, "status": "True", "reason": reason, "message": message})
    pod["status"]["conditions"] = conds


def _complete_resize(pod: dict[str, Any]) -> None:
    pod["status"]["conditions"] = [
        c for c in pod["status"].get("conditions", []) if c["type"] not in _RESIZE_CONDITIONS
    ]
    for c, st in zip(pod["spec"]["containers"], pod["status"]["containerStatuses"], strict=False):
        st["resources"] = copy.deepcopy(c.get("resources", {}))


def _start_resize(pod: dict[str, Any], outcome: ResizeOutcome) -> None:
    specs = [c.get("resources", {}) for c in pod["spec"]["containers"]]
    actual = [s.get("resources", {}) for s in pod["status"]["containerStatuses"]]
    if specs == actual or outcome.kind == "complete":
        _complete_resize(pod)
    elif outcome.kind in ("deferred", "infeasible"):
        _set_condition(pod, "PodResizePending", outcome.kind.capitalize(), outcome.message)
    elif outcome.kind == "inprogress":
        _set_condition(pod, "PodResizeInProgress", "", "")
    elif outcome.kind == "error":
        _set_condition(pod, "PodResizeInProgress", "Error", outcome.message or "resize failed")
    else:
        raise ValueError(f"unknown resize outcome {outcome.kind!r}")


def _owned(pod: dict[str, Any], key: tuple[str, str]) -> bool:
    return (
        pod["metadata"]["namespace"] == key[0]
        and pod["metadata"]["labels"].get("ray.io/cluster") == key[1]
    )


# -- HTTP ---------------------------------------------------------------------------------
def _handler(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                self._send(400, _status(400, "BadRequest", "request body is not JSON"))
                return
            try:
                code, out = fake.handle(self.command, self.path, ctype, body)
            except ApiError as err:
                self._send(err.code, _status(err.code, err.reason, err.message))
                return
            self._send(code, out)

        def _send(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _serve

    return Handler


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
