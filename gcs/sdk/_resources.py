"""``request_resources`` with Ray 2.60's arguments, checks and wire message; cluster status.

``request_resources(num_cpus=4, bundles=[{"GPU": 1}], address="host:port")`` replaces the
cluster's resource constraint with one ``RequestClusterResourceConstraint`` call, exactly as
``ray.autoscaler.sdk.request_resources`` does against a v2 autoscaler: ``num_cpus`` becomes
that many ``{"CPU": 1}`` bundles, identical (bundle, selector) pairs are counted, groups keep
first-seen order, an empty selector sends no ``label_selectors`` entry (an empty bundle still
sends an empty ``request``), and a call with
nothing to request sends an empty request (which clears the constraint).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from gcs.base.ha_keys import HA_LEADER_KEY, HA_NAMESPACE
from gcs.base.labels import label_selector_error, selector_proto
from gcs.policy.autoscaling.scheduler.waiting import WaitingDemand
from gcs.policy.autoscaling.scheduler.waiting import from_json as waiting_from_json
from gcs.proto import autoscaler_pb2, gcs_service_pb2
from gcs.rpc.descriptors import AUTOSCALER_STATE
from gcs.sdk._address import resolve_address
from gcs.sdk._client import DEFAULT_TIMEOUT_S, AsyncGcsClient, GcsClient
from gcs.sdk._errors import RpcError

_SELECTOR_SHAPE_MESSAGE = (
    "Bundle label selector must be a list of string dictionary label selectors. For example: "
    '`[{ray.io/market_type": "spot"}, {"ray.io/accelerator-type": "A100"}]`.'
)


def validate_request(
    num_cpus: Any = None, bundles: Any = None, bundle_label_selectors: Any = None
) -> None:
    """Raise Ray's ``TypeError`` / ``ValueError`` (same order, same text) for bad arguments."""
    if num_cpus is not None and not isinstance(num_cpus, int):
        raise TypeError("num_cpus should be of type int.")
    if bundles is not None:
        if not isinstance(bundles, list):
            raise TypeError("bundles should be of type List")
        for bundle in bundles:
            if not isinstance(bundle, dict):
                raise TypeError("each bundle should be a Dict.")
            for key, value in bundle.items():
                if not isinstance(key, str):
                    raise TypeError("each bundle key should be str.")
                # bool is an int; Ray refuses {"CPU": True} rather than read it as 1.
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError("each bundle value should be a number (int or float).")
    if bundle_label_selectors is not None:
        if bundles is None:
            raise ValueError(
                "`bundles` must be provided when `bundle_label_selectors` is specified."
            )
        if len(bundle_label_selectors) != len(bundles):
            raise ValueError(
                "`bundle_label_selector` must be a list with length equal to the number of bundles."
            )
        for selector in bundle_label_selectors:
            if not isinstance(selector, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
            ):
                raise ValueError(_SELECTOR_SHAPE_MESSAGE)
            problem = label_selector_error(selector)
            if problem:
                raise ValueError(
                    "Invalid label selector provided in bundle_label_selectors list. "
                    f"Detailed error: '{problem}'"
                )


def build_constraint_request(
    num_cpus: int | None = None,
    bundles: Sequence[Mapping[str, float]] | None = None,
    bundle_label_selectors: Sequence[Mapping[str, str]] | None = None,
) -> autoscaler_pb2.RequestClusterResourceConstraintRequest:
    """The request Ray sends for these (already validated) arguments."""
    wanted: list[tuple[Mapping[str, float], Mapping[str, str]]] = [
        ({"CPU": 1}, {}) for _ in range(num_cpus or 0)
    ]
    for i, bundle in enumerate(bundles or ()):
        wanted.append((bundle, bundle_label_selectors[i] if bundle_label_selectors else {}))
    groups: Counter[tuple[frozenset, frozenset]] = Counter()
    first_seen: dict[tuple[frozenset, frozenset], tuple[Mapping, Mapping]] = {}
    for resources, selector in wanted:
        key = (frozenset(resources.items()), frozenset(selector.items()))
        groups[key] += 1
        first_seen.setdefault(key, (resources, selector))
    request = autoscaler_pb2.RequestClusterResourceConstraintRequest()
    if not groups:
        return request  # Ray sends an empty message, not an empty constraint
    constraint = request.cluster_resource_constraint
    for key, count in groups.items():
        resources, selector = first_seen[key]
        by_count = constraint.resource_requests.add(count=count)
        by_count.request.SetInParent()  # Ray sends `request {}` even for an empty bundle
        for name, amount in resources.items():
            by_count.request.resources_bundle[name] = float(amount)
        if selector:
            by_count.request.label_selectors.append(selector_proto(selector))
    return request


def request_resources(
    num_cpus: int | None = None,
    bundles: list[dict[str, float]] | None = None,
    bundle_label_selectors: list[dict[str, str]] | None = None,
    *,
    address: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Ask the autoscaler to keep room for these resources (replaces the previous request).

    Same arguments and errors as Ray 2.60's ``ray.autoscaler.sdk.request_resources``; the
    address comes from ``address``, ``GCS_ADDRESS`` or ``RAY_ADDRESS`` instead of
    ``ray.init()``.  Raises :class:`gcs.sdk.RpcError` when the call fails.
    """
    validate_request(num_cpus, bundles, bundle_label_selectors)
    request = build_constraint_request(num_cpus, bundles, bundle_label_selectors)
    with GcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        client.call(AUTOSCALER_STATE, "RequestClusterResourceConstraint", request)


async def request_resources_async(
    num_cpus: int | None = None,
    bundles: list[dict[str, float]] | None = None,
    bundle_label_selectors: list[dict[str, str]] | None = None,
    *,
    address: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """:func:`request_resources` for code already running on an event loop."""
    validate_request(num_cpus, bundles, bundle_label_selectors)
    request = build_constraint_request(num_cpus, bundles, bundle_label_selectors)
    async with AsyncGcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        await client.call(AUTOSCALER_STATE, "RequestClusterResourceConstraint", request)


def get_cluster_status(
    address: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> autoscaler_pb2.GetClusterStatusReply:
    """``AutoscalerStateService.GetClusterStatus``: what ``ray status`` shows, as a proto."""
    with GcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        return client.call(
            AUTOSCALER_STATE, "GetClusterStatus", autoscaler_pb2.GetClusterStatusRequest()
        )


async def get_cluster_status_async(
    address: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> autoscaler_pb2.GetClusterStatusReply:
    async with AsyncGcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        return await client.call(
            AUTOSCALER_STATE, "GetClusterStatus", autoscaler_pb2.GetClusterStatusRequest()
        )


AUTOSCALER_EVENTS_NAMESPACE = b"gcs_autoscaler"
AUTOSCALER_EVENTS_KEY = b"events"
AUTOSCALER_WAITING_KEY = b"waiting"
"""Why demand waits, as the autoscaler's last round decided (:mod:`gcs.policy.autoscaling.scheduler.
waiting`)."""


def _waiting_from(reply: gcs_service_pb2.InternalKVGetReply) -> tuple[WaitingDemand, ...] | None:
    if reply.status.code != 0 or not reply.value:
        return None
    try:
        return waiting_from_json(reply.value)
    except ValueError:
        return None


def get_autoscaler_waiting(
    address: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[WaitingDemand, ...] | None:
    """Why each piece of pending demand waits (infeasible / capped / pending capacity, and
    its virtual cluster), as our autoscaler (embedded or standalone) last published it;
    None when none did (e.g. Ray's own autoscaler runs)."""
    from gcs.rpc.descriptors import INTERNAL_KV

    request = gcs_service_pb2.InternalKVGetRequest(
        namespace=AUTOSCALER_EVENTS_NAMESPACE, key=AUTOSCALER_WAITING_KEY
    )
    with GcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        try:
            reply = client.call(INTERNAL_KV, "InternalKVGet", request)
        except RpcError as err:
            if err.status == grpc.StatusCode.UNIMPLEMENTED:  # a GCS without InternalKV
                return None
            raise
    return _waiting_from(reply)


async def get_autoscaler_waiting_async(
    address: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[WaitingDemand, ...] | None:
    """:func:`get_autoscaler_waiting` on the caller's event loop."""
    from gcs.rpc.descriptors import INTERNAL_KV

    request = gcs_service_pb2.InternalKVGetRequest(
        namespace=AUTOSCALER_EVENTS_NAMESPACE, key=AUTOSCALER_WAITING_KEY
    )
    async with AsyncGcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        try:
            reply = await client.call(INTERNAL_KV, "InternalKVGet", request)
        except RpcError as err:
            if err.status == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise
    return _waiting_from(reply)


def get_ha_leader(
    address: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, object] | None:
    """The HA leader serving ``address`` as it recorded itself; None for a GCS without
    ``--ha`` (or one that never recorded a leader)."""
    import json

    from gcs.proto import gcs_service_pb2
    from gcs.rpc.descriptors import INTERNAL_KV

    with GcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        try:
            reply = client.call(
                INTERNAL_KV,
                "InternalKVGet",
                gcs_service_pb2.InternalKVGetRequest(namespace=HA_NAMESPACE, key=HA_LEADER_KEY),
            )
        except RpcError as err:
            if err.status == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise
    if reply.status.code != 0 or not reply.value:
        return None
    try:
        leader = json.loads(reply.value)
    except ValueError:
        return None
    return leader if isinstance(leader, dict) else None


def get_autoscaler_events(
    address: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[dict[str, object]]:
    """Recent autoscaler events (``{"t", "kind", "message"}``, oldest first), as the
    autoscaler (embedded or standalone) publishes them to the GCS's InternalKV; ``[]`` when
    no autoscaler runs."""
    import json

    from gcs.proto import gcs_service_pb2
    from gcs.rpc.descriptors import INTERNAL_KV

    with GcsClient(resolve_address(address), timeout_s=timeout_s) as client:
        try:
            reply = client.call(
                INTERNAL_KV,
                "InternalKVGet",
                gcs_service_pb2.InternalKVGetRequest(
                    namespace=AUTOSCALER_EVENTS_NAMESPACE, key=AUTOSCALER_EVENTS_KEY
                ),
            )
        except RpcError as err:
            if err.status == grpc.StatusCode.UNIMPLEMENTED:  # a GCS without InternalKV
                return []
            raise
    if reply.status.code != 0 or not reply.value:
        return []
    try:
        events = json.loads(reply.value)
    except ValueError:
        return []
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
