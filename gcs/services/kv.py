"""``ray.rpc.InternalKVGcsService``."""

from __future__ import annotations

import json
from typing import Any

from gcs.managers.kv import MAX_KEY_BYTES, KvManager
from gcs.proto import gcs_service_pb2
from gcs.rpc.errors import InvalidArgument, NotFound
from gcs.services.common import error_status, ok_status

Req = gcs_service_pb2

# What a real raylet's GetInternalConfig expects (gcs-server.md §8.1 step 6).
DEFAULT_INTERNAL_CONFIG = {"automatic_object_spilling_enabled": False}


def _key(key: bytes, field: str = "key") -> bytes:
    if not key:
        raise InvalidArgument(f"{field} must not be empty")
    if len(key) > MAX_KEY_BYTES:
        raise InvalidArgument(f"{field} is longer than {MAX_KEY_BYTES} bytes")
    return key


class InternalKVServicer:
    def __init__(self, kv: KvManager, *, internal_config: dict[str, Any] | None = None) -> None:
        self._kv = kv
        self._config = json.dumps(internal_config or DEFAULT_INTERNAL_CONFIG)

    async def InternalKVGet(self, request: Req.InternalKVGetRequest, context: Any) -> Any:
        value = await self._kv.get(request.namespace, _key(request.key))
        if value is None:
            return Req.InternalKVGetReply(status=error_status(NotFound("Failed to find the key")))
        return Req.InternalKVGetReply(status=ok_status(), value=value)

    async def InternalKVMultiGet(self, request: Any, context: Any) -> Any:
        keys = [_key(k, f"keys[{i}]") for i, k in enumerate(request.keys)]
        found = await self._kv.multi_get(request.namespace, keys)
        out = Req.InternalKVMultiGetReply(status=ok_status())
        for key in keys:
            if key in found:
                out.results.add(key=key, value=found[key])
        return out

    async def InternalKVPut(self, request: Req.InternalKVPutRequest, context: Any) -> Any:
        added = await self._kv.put(
            request.namespace, _key(request.key), request.value, overwrite=request.overwrite
        )
        return Req.InternalKVPutReply(status=ok_status(), added=added)

    async def InternalKVDel(self, request: Req.InternalKVDelRequest, context: Any) -> Any:
        key = request.key if request.del_by_prefix else _key(request.key)
        deleted = await self._kv.delete(request.namespace, key, by_prefix=request.del_by_prefix)
        return Req.InternalKVDelReply(status=ok_status(), deleted_num=deleted)

    async def InternalKVExists(self, request: Any, context: Any) -> Any:
        exists = await self._kv.exists(request.namespace, _key(request.key))
        return Req.InternalKVExistsReply(status=ok_status(), exists=exists)

    async def InternalKVKeys(self, request: Any, context: Any) -> Any:
        keys = await self._kv.keys(request.namespace, request.prefix)
        return Req.InternalKVKeysReply(status=ok_status(), results=keys)

    async def GetInternalConfig(self, request: Any, context: Any) -> Any:
        return Req.GetInternalConfigReply(status=ok_status(), config=self._config)
