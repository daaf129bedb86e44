"""``ray.rpc.InternalKVGcsService``."""

from __future__ import annotations

import json
from typing import Any

from gcs.config import RequestLimits
from gcs.managers.kv import KvManager
from gcs.proto import gcs_service_pb2
from gcs.rpc.errors import NotFound
from gcs.rpc.method_paths import varint
from gcs.rpc.server import SplicedReply
from gcs.services import validate
from gcs.services.common import error_status, ok_status, reply_too_large

Req = gcs_service_pb2

_SPLICE_VALUE_BYTES = 1 << 20
_OK_STATUS = Req.InternalKVGetReply(status=ok_status()).SerializeToString()
_VALUE_TAG = b"\x12"  # InternalKVGetReply.value: field 2, length-delimited


# What a real raylet's GetInternalConfig expects (it reads this JSON at start-up).
DEFAULT_INTERNAL_CONFIG = {"automatic_object_spilling_enabled": False}


class InternalKVServicer:
    def __init__(
        self,
        kv: KvManager,
        *,
        limits: RequestLimits,
        internal_config: dict[str, Any] | None = None,
    ) -> None:
        self._kv = kv
        self._limits = limits
        self._config = json.dumps(internal_config or DEFAULT_INTERNAL_CONFIG)

    def _key(self, key: bytes, field: str = "key") -> bytes:
        return validate.blob(key, field, self._limits.max_kv_key_bytes, required=True)

    def _ns(self, namespace: bytes) -> bytes:
        return validate.blob(namespace, "namespace", self._limits.max_name_bytes)

    async def InternalKVGet(self, request: Req.InternalKVGetRequest, context: Any) -> Any:
        value = await self._kv.get(self._ns(request.namespace), self._key(request.key))
        if value is None:
            return Req.InternalKVGetReply(status=error_status(NotFound("Failed to find the key")))
        if len(value) >= _SPLICE_VALUE_BYTES:  # the value is sent as stored, never copied
            return SplicedReply(_OK_STATUS + _VALUE_TAG + varint(len(value)), value)
        return Req.InternalKVGetReply(status=ok_status(), value=value)

    async def InternalKVMultiGet(self, request: Any, context: Any) -> Any:
        validate.entries(request.keys, "keys", self._limits.max_repeated_entries)
        keys = [self._key(k, f"keys[{i}]") for i, k in enumerate(request.keys)]
        limit = self._limits.max_reply_bytes
        found = await self._kv.multi_get_bounded(self._ns(request.namespace), keys, max_bytes=limit)
        if found is None:
            raise reply_too_large(limit, "the values of these keys")
        out = Req.InternalKVMultiGetReply(status=ok_status())
        for key in keys:
            if key in found:
                out.results.add(key=key, value=found[key])
        return out

    async def InternalKVPut(self, request: Req.InternalKVPutRequest, context: Any) -> Any:
        namespace, key = self._ns(request.namespace), self._key(request.key)
        value = validate.blob(request.value, "value", self._limits.max_kv_value_bytes)
        added = await self._kv.put(namespace, key, value, overwrite=request.overwrite)
        return Req.InternalKVPutReply(status=ok_status(), added=added)

    async def InternalKVDel(self, request: Req.InternalKVDelRequest, context: Any) -> Any:
        if request.del_by_prefix:
            key = validate.blob(request.key, "key", self._limits.max_kv_key_bytes)
        else:
            key = self._key(request.key)
        namespace = self._ns(request.namespace)
        deleted = await self._kv.delete(namespace, key, by_prefix=request.del_by_prefix)
        return Req.InternalKVDelReply(status=ok_status(), deleted_num=deleted)

    async def InternalKVExists(self, request: Any, context: Any) -> Any:
        exists = await self._kv.exists(self._ns(request.namespace), self._key(request.key))
        return Req.InternalKVExistsReply(status=ok_status(), exists=exists)

    async def InternalKVKeys(self, request: Any, context: Any) -> Any:
        prefix = validate.blob(request.prefix, "prefix", self._limits.max_kv_key_bytes)
        limit = self._limits.max_reply_bytes
        keys = await self._kv.keys(self._ns(request.namespace), prefix, max_bytes=limit)
        if keys is None:
            raise reply_too_large(limit, "the keys under this prefix")
        return Req.InternalKVKeysReply(status=ok_status(), results=keys)

    async def GetInternalConfig(self, request: Any, context: Any) -> Any:
        return Req.GetInternalConfigReply(status=ok_status(), config=self._config)
