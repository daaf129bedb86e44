"""JSON patch (RFC 6902) and JSON merge patch (RFC 7396) as the Kubernetes API server
applies them, for the fake API server.  Errors carry the HTTP code the real server answers:
400 for a malformed body, 422 for a path that does not exist or a failed ``test`` op."""

from __future__ import annotations

import copy
from typing import Any

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def patched(obj: dict[str, Any], ctype: str, body: Any) -> dict[str, Any]:
    if ctype == JSON_PATCH:
        if not isinstance(body, list):
            raise ApiError(400, "BadRequest", "json patch body must be a list of operations")
        return _json_patch(obj, body)
    if ctype in (MERGE_PATCH, STRATEGIC_PATCH):
        if not isinstance(body, dict):
            raise ApiError(
                400,
                "BadRequest",
                "error decoding patch: json: cannot unmarshal array into Go value of type "
                "map[string]interface {}",
            )
        return _merge(copy.deepcopy(obj), body)
    raise ApiError(415, "UnsupportedMediaType", f"unsupported patch content type {ctype!r}")


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = _merge(target.get(k), v)
    return target


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(obj: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    doc = copy.deepcopy(obj)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, "BadRequest", f"malformed json patch operation {op!r}")
        *parents, last = _pointer(op["path"])
        node: Any = doc
        try:
            for p in parents:
                node = node[int(p)] if isinstance(node, list) else node[p]
        except (KeyError, IndexError, ValueError):
            raise ApiError(422, "Invalid", f"path {op['path']} does not exist") from None
        kind = op["op"]
        try:
            if kind == "test":
                current = node[int(last)] if isinstance(node, list) else node.get(last)
                if current != op.get("value"):
                    raise ApiError(
                        422,
                        "Invalid",
                        f"the server rejected our request due to an error in our request: "
                        f"testing value {op['path']} failed",
                    )
            elif kind in ("add", "replace"):
                value = copy.deepcopy(op.get("value"))
                if isinstance(node, list):
                    if last == "-":
                        node.append(value)
                    elif kind == "add":
                        node.insert(int(last), value)
                    else:
                        node[int(last)] = value
                else:
                    if kind == "replace" and last not in node:
                        raise ApiError(422, "Invalid", f"replace: missing path {op['path']}")
                    node[last] = value
            elif kind == "remove":
                if isinstance(node, list):
                    node.pop(int(last))
                else:
                    del node[last]
            else:
                raise ApiError(400, "BadRequest", f"unsupported json patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"{kind}: invalid path {op['path']}") from None
    return doc
