"""Warnings Ray's GCS publishes about actors on the error channel (``RAY_ERROR_INFO``).

Drivers print them (``ray.init`` subscribes to its job's errors).  Ray 2.60 has one: a named
*detached* actor registered in an *anonymous* namespace (the random UUID ``ray.init()`` gives a
job without ``namespace=``) can never be looked up again by another job, so the GCS warns the
job that registers it (``GcsActorManager::RegisterActor``).
"""

from __future__ import annotations

import re

from gcs.proto import gcs_pb2

DETACHED_ACTOR_ANONYMOUS_NAMESPACE = "detached_actor_anonymous_namespace"
"""``ErrorTableData.type`` (Ray's ``ray_constants.DETACHED_ACTOR_ANONYMOUS_NAMESPACE_ERROR``)."""

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def is_anonymous_namespace(namespace: str) -> bool:
    """Ray's ``is_uuid``: the namespace ``ray.init()`` makes up when none is given."""
    return _UUID.fullmatch(namespace) is not None


def detached_in_anonymous_namespace(
    actor: gcs_pb2.ActorTableData, now_ms: int
) -> gcs_pb2.ErrorTableData | None:
    """The warning for a newly registered named detached actor in an anonymous namespace,
    else None.  Published keyed by the job id in hex, as Ray's ``PublishError`` keys it."""
    if not (actor.name and actor.is_detached and is_anonymous_namespace(actor.ray_namespace)):
        return None
    return gcs_pb2.ErrorTableData(
        job_id=actor.job_id,
        type=DETACHED_ACTOR_ANONYMOUS_NAMESPACE,
        error_message=(
            "It looks like you're creating a detached actor in an anonymous namespace. In "
            "order to access this actor in the future, you will need to explicitly connect to "
            f'this namespace with ray.init(namespace="{actor.ray_namespace}", ...)'
        ),
        timestamp=now_ms,
    )
