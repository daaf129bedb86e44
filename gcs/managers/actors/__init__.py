"""Actors (Ray's ``GcsActorManager``), split by phase: see :mod:`.manager`.

The public names stay importable from here (``from gcs.managers.actors import ActorManager``).
"""

from gcs.managers.actors.manager import ActorManager
from gcs.managers.actors.records import (
    ACTOR_ID_SIZE,
    CREATION_EXIT_REPORT_GRACE_S,
    TABLE_ACTOR,
    TABLE_ACTOR_TASK_SPEC,
    CreateOutcome,
)
from gcs.managers.actors.view import ActorView

__all__ = [
    "ACTOR_ID_SIZE",
    "CREATION_EXIT_REPORT_GRACE_S",
    "TABLE_ACTOR",
    "TABLE_ACTOR_TASK_SPEC",
    "ActorManager",
    "ActorView",
    "CreateOutcome",
]
