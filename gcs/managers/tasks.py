"""Task events (``ray.rpc.TaskInfoGcsService``): what ``ray list tasks`` and the dashboard read.

Core workers batch their task events (state transitions with timestamps, task info, profile
events) and send them with ``AddTaskEventData`` about once a second.  Ray's GCS keeps them in
memory only (never persisted), merged per task attempt, with Ray's bounds:

* at most ``max_tasks`` attempts (``RAY_task_events_max_num_task_in_gcs``, 100,000); past it
  the GCS evicts, oldest first within a priority: finished or failed tasks, then actor
  tasks, then the rest (Ray's finished/actor-task GC policy), and counts each evicted
  attempt as a dropped status event of its job;
* at most ``max_profile_events_per_task`` profile events per attempt
  (``RAY_task_events_max_num_profile_events_per_task``, 1,000), the excess counted as
  dropped profile events;
* workers' own drop reports (``dropped_task_attempts``, ``num_profile_events_dropped``) add
  to the same per-job counters, and an attempt a worker reports dropped is not kept (nor
  are its later events).

Attempts that will never report again are failed here, as Ray's ``GcsTaskManager`` does:
when their worker dies (:meth:`TaskEventStore.fail_worker_tasks`) or their job finishes
(:meth:`TaskEventStore.fail_job_tasks`), each attempt not yet FINISHED or FAILED gets a
FAILED timestamp and a ``WORKER_DIED`` error with Ray's message, so ``ray list tasks`` shows
no RUNNING ghosts.  ``gcs.managers.task_failures`` calls them after Ray's delays.

No store write, so no lane: an ``add`` is one synchronous step on the event loop (nothing
can interleave), and reads never wait.

Each attempt is held serialized (:class:`Held`: its bytes plus the few fields the usual
query and the indexes read), not as a protobuf message: a message kept on its own holds an
upb arena of about 2.5 KiB for an event of a few hundred bytes, so 10,000 tiny tasks cost
~25 MB of the GCS's memory that way (Ray keeps up to 100,000).  A merge appends the
incoming bytes (:meth:`Held.merge`); a reply splices the bytes as they are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from gcs.base.errors import InvalidArgument, RayStatusCode
from gcs.base.protowire import VARINT_TABLE, VARINT_TABLE_SIZE, framed_size, int_field, varint
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2

TaskKey = tuple[bytes, int]
"""(task id, attempt number)."""

_TERMINAL = (common_pb2.FINISHED, common_pb2.FAILED)
_PRIORITY_TERMINAL, _PRIORITY_ACTOR, _PRIORITY_OTHER = 0, 1, 2
EQUAL = gcs_service_pb2.EQUAL
_PREDICATES = frozenset(gcs_service_pb2.FilterPredicate.values())
_INT32_MAX = 2**31 - 1
_OK_STATUS_FIELD = b"\x0a\x00"
"""GetTaskEventsReply.status (1): an OK GcsStatus (code 0, no message: empty)."""
_EVENTS_TAG = b"\x12"
"""GetTaskEventsReply.events_by_task (2), length-delimited."""
_DROPPED_TRACKED_UNLIMITED = 100_000
"""Attempts remembered as dropped when the task limit is off (that index stays bounded)."""


class Held:
    """One attempt's events, serialized, with what reads and indexes need without parsing."""

    __slots__ = (
        "has_info", "has_state", "job_id", "kind", "msg", "profiles", "terminal", "wire",
        "worker_id",
    )  # fmt: skip

    def __init__(self, events: gcs_pb2.TaskEvents, *, keep: bool = False) -> None:
        """``keep``: hold ``events`` itself (an attempt at the profile-event limit, trimmed
        at each report: re-serializing its 1,000 events each time cost 8x a merge)."""
        self.msg = events if keep else None
        self.wire = b"" if keep else events.SerializeToString()
        self.job_id = events.job_id
        self.worker_id = events.state_updates.worker_id
        self.has_info = events.HasField("task_info")
        self.kind = events.task_info.type
        self.has_state = events.HasField("state_updates")
        self.terminal = _terminal(events)
        self.profiles = (
            len(events.profile_events.events) if events.HasField("profile_events") else 0
        )

    def events(self) -> gcs_pb2.TaskEvents:
        return self.msg if self.msg is not None else gcs_pb2.TaskEvents.FromString(self.wire)

    def data(self) -> bytes:
        return self.wire if self.msg is None else self.msg.SerializeToString()

    def merge(self, incoming: gcs_pb2.TaskEvents) -> None:
        """``MergeFrom(incoming)`` at the cost of ``incoming`` alone: protobuf parses two
        serialized messages one after the other as the first merged with the second (later
        scalars win when set, map entries by key, repeated fields append), so the bytes are
        appended; the fields kept beside them are merged the same way."""
        if self.msg is not None:
            self.msg.MergeFrom(incoming)
        else:
            self.wire += incoming.SerializeToString()
        if incoming.job_id:
            self.job_id = incoming.job_id
        if incoming.HasField("state_updates"):
            self.has_state = True
            self.terminal = self.terminal or _terminal(incoming)
            if incoming.state_updates.worker_id:
                self.worker_id = incoming.state_updates.worker_id
        if incoming.HasField("task_info"):
            self.has_info = True
            self.kind = incoming.task_info.type or self.kind
        if incoming.HasField("profile_events"):
            self.profiles += len(incoming.profile_events.events)


def _terminal(events: gcs_pb2.TaskEvents) -> bool:
    stamps = events.state_updates.state_ts_ns
    return any(state in stamps for state in _TERMINAL)  # Ray's IsTaskTerminated


@dataclass(slots=True)
class JobDrops:
    status: int = 0
    profile: int = 0


def latest_state(events: gcs_pb2.TaskEvents) -> int:
    """The task's current state: the one with the newest timestamp (FAILED / FINISHED win a
    tie); NIL when no state was reported."""
    stamps = events.state_updates.state_ts_ns
    if not stamps:
        return common_pb2.NIL
    return max(stamps.items(), key=lambda kv: (kv[1], kv[0] in _TERMINAL, kv[0]))[0]


class TaskEventStore:
    def __init__(self, *, max_tasks: int = 100_000, max_profile_events_per_task: int = 1000):
        """``max_tasks`` <= 0: no limit (Ray's -1, and 0 in its ``> 0`` check);
        ``max_profile_events_per_task`` < 0: no limit, 0: none kept."""
        self._max_tasks = max_tasks if max_tasks > 0 else None
        self._max_profile = (
            max_profile_events_per_task if max_profile_events_per_task >= 0 else None
        )
        self._max_dropped_tracked = self._max_tasks or _DROPPED_TRACKED_UNLIMITED
        self._events: dict[TaskKey, Held] = {}
        # one insertion-ordered index per eviction priority (oldest first)
        self._by_priority: tuple[OrderedDict[TaskKey, None], ...] = (
            OrderedDict(),
            OrderedDict(),
            OrderedDict(),
        )
        self._priority: dict[TaskKey, int] = {}
        self._by_job: dict[bytes, set[TaskKey]] = {}
        self._by_worker: dict[bytes, set[TaskKey]] = {}
        """Attempts per job and per worker (``state_updates.worker_id``), for failing them."""
        self._drops: dict[bytes, JobDrops] = {}
        self._dropped_attempts: OrderedDict[TaskKey, None] = OrderedDict()
        """Attempts a worker reported lost: their later events are ignored (as in Ray);
        bounded like the events themselves, oldest forgotten first."""
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._events)

    def drops(self, job_id: bytes) -> JobDrops:
        return self._drops.get(job_id, JobDrops())

    # -- writes --------------------------------------------------------------------------
    def add(self, data: gcs_pb2.TaskEventData) -> None:
        for i, events in enumerate(data.events_by_task):
            if not events.task_id:
                raise InvalidArgument(f"data.events_by_task[{i}].task_id is empty")
        job_drops = self._drops_of(data.job_id)
        job_drops.profile += max(data.num_profile_events_dropped, 0)
        for attempt in data.dropped_task_attempts:
            key = (attempt.task_id, attempt.attempt_number)
            self._remove(key)
            job_drops.status += 1
            self._dropped_attempts[key] = None
            if len(self._dropped_attempts) > self._max_dropped_tracked:
                self._dropped_attempts.popitem(last=False)
        for events in data.events_by_task:
            if (events.task_id, events.attempt_number) not in self._dropped_attempts:
                self._merge(events)
        while self._max_tasks is not None and len(self._events) > self._max_tasks:
            self._evict_one()

    def _drops_of(self, job_id: bytes) -> JobDrops:
        drops = self._drops.get(job_id)
        if drops is None:
            drops = self._drops[job_id] = JobDrops()
        return drops

    def _merge(self, incoming: gcs_pb2.TaskEvents) -> None:
        key = (incoming.task_id, incoming.attempt_number)
        held = self._events.get(key)
        incoming_profiles = (
            len(incoming.profile_events.events) if incoming.HasField("profile_events") else 0
        )
        limit = self._max_profile
        if held is not None and (
            held.msg is not None or limit is None or held.profiles + incoming_profiles <= limit
        ):
            held.merge(incoming)  # state timestamps by state, profile events append, info fills
            if held.msg is not None and limit is not None and held.profiles > limit:
                excess = held.profiles - limit
                del held.msg.profile_events.events[:excess]
                held.profiles = limit
                self._drops_of(held.job_id).profile += excess
        else:
            if held is None:
                events = incoming
            else:
                events = held.events()
                events.MergeFrom(incoming)
            if limit is not None and events.HasField("profile_events"):
                excess = len(events.profile_events.events) - limit
                if excess > 0:
                    if events is incoming:  # the caller's message stays as it was
                        events = gcs_pb2.TaskEvents()
                        events.CopyFrom(incoming)
                    del events.profile_events.events[:excess]
                    self._drops_of(events.job_id).profile += excess
            # an attempt past the limit keeps its message: it is trimmed at each report
            held = self._events[key] = Held(events, keep=held is not None or events is not incoming)
        self._reindex(key, held)
        self._by_job.setdefault(held.job_id, set()).add(key)
        if held.worker_id:
            self._by_worker.setdefault(held.worker_id, set()).add(key)

    def _reindex(self, key: TaskKey, held: Held) -> None:
        if held.terminal:
            priority = _PRIORITY_TERMINAL  # Ray's IsTaskTerminated
        elif held.kind == common_pb2.ACTOR_TASK:
            priority = _PRIORITY_ACTOR
        else:
            priority = _PRIORITY_OTHER
        old = self._priority.get(key)
        if old == priority:
            return
        if old is not None:
            self._by_priority[old].pop(key, None)
        self._by_priority[priority][key] = None
        self._priority[key] = priority

    def _remove(self, key: TaskKey) -> Held | None:
        held = self._events.pop(key, None)
        priority = self._priority.pop(key, None)
        if priority is not None:
            self._by_priority[priority].pop(key, None)
        if held is not None:
            _unindex(self._by_job, held.job_id, key)
            _unindex(self._by_worker, held.worker_id, key)
        return held

    def fail_worker_tasks(self, worker_id: bytes, failure: gcs_pb2.WorkerTableData) -> int:
        """Ray's ``MarkTasksFailedOnWorkerDead``: the unfinished attempts that ran on
        ``worker_id`` fail at the worker's end time.  Returns how many were marked."""
        error = common_pb2.RayErrorInfo(
            error_type=common_pb2.WORKER_DIED,
            error_message=(
                f"Worker running the task ({worker_id.hex()}) died with exit_type: "
                f"{failure.exit_type} with error_message: {failure.exit_detail}"
            ),
        )
        keys = self._by_worker.get(worker_id, ())
        return self._fail(list(keys), failure.end_time_ms * 1_000_000, error)

    def fail_job_tasks(self, job_id: bytes, finish_time_ms: int) -> int:
        """Ray's ``MarkTasksFailedOnJobEnds``: the job's unfinished attempts fail at its end
        time.  Returns how many were marked."""
        error = common_pb2.RayErrorInfo(
            error_type=common_pb2.WORKER_DIED,
            error_message=(
                f"Job finishes ({job_id.hex()}) as driver exits. "
                "Marking all non-terminal tasks as failed."
            ),
        )
        keys = self._by_job.get(job_id, ())
        return self._fail(list(keys), finish_time_ms * 1_000_000, error)

    def _fail(self, keys: list[TaskKey], failed_ts_ns: int, error: common_pb2.RayErrorInfo) -> int:
        marked = 0
        for key in keys:
            events = self._events[key].events()
            stamps = events.state_updates.state_ts_ns
            if any(state in stamps for state in _TERMINAL):
                continue  # Ray's IsTaskTerminated: a finished or failed attempt stays so
            # never before the attempt's last state (a worker without an end time, skew)
            stamps[common_pb2.FAILED] = max(failed_ts_ns, *stamps.values(), 0)
            events.state_updates.error_info.CopyFrom(error)
            held = self._events[key] = Held(events)  # the same worker: indexes hold
            self._reindex(key, held)
            marked += 1
        return marked

    def _evict_one(self) -> None:
        for index in self._by_priority:
            if index:
                key = next(iter(index))
                held = self._remove(key)
                assert held is not None
                self._drops_of(held.job_id).status += 1
                self.evicted += 1
                return

    # -- reads ---------------------------------------------------------------------------
    def newest_first(self) -> Iterator[Held]:
        """Every attempt in Ray's reply order: finished or failed ones, then actor tasks,
        then the rest, each group newest first (the most recently added, or moved into the
        group by a state change); ``limit`` keeps the front of it."""
        for key in self._newest_first_keys():
            yield self._events[key]

    def _newest_first_keys(self) -> Iterator[TaskKey]:
        for index in self._by_priority:
            yield from reversed(index)

    def _candidates(
        self, f: gcs_service_pb2.GetTaskEventsRequest.Filters
    ) -> tuple[list[Held], JobDrops]:
        """Ray's pre-selection and the loss it reports with it: one task id (EQUAL) -> its
        attempts, no loss; else one job id -> its attempts and that job's loss; several
        EQUAL ids of the kind it looks at -> nothing; otherwise everything and all loss."""
        if f.task_filters:
            task_ids = {tf.task_id for tf in f.task_filters if tf.predicate == EQUAL}
            if len(task_ids) == 1:
                (task_id,) = task_ids
                return [
                    self._events[key] for key in self._newest_first_keys() if key[0] == task_id
                ], JobDrops()
            if task_ids:
                return [], JobDrops()
        elif f.job_filters:
            job_ids = {jf.job_id for jf in f.job_filters if jf.predicate == EQUAL}
            if len(job_ids) == 1:
                (job_id,) = job_ids
                keys = self._by_job.get(job_id, ())
                held = [self._events[key] for key in self._newest_first_keys() if key in keys]
                return held, self.drops(job_id)
            if job_ids:
                return [], JobDrops()
        total = JobDrops(
            status=sum(d.status for d in self._drops.values()),
            profile=sum(d.profile for d in self._drops.values()),
        )
        return list(self.newest_first()), total

    def query(
        self, request: gcs_service_pb2.GetTaskEventsRequest, *, max_bytes: int | None = None
    ) -> gcs_service_pb2.GetTaskEventsReply:
        """:meth:`query_wire` as a message (for callers in this process)."""
        return gcs_service_pb2.GetTaskEventsReply.FromString(
            self.query_wire(request, max_bytes=max_bytes)
        )

    def query_wire(
        self, request: gcs_service_pb2.GetTaskEventsRequest, *, max_bytes: int | None = None
    ) -> bytes:
        """Ray 2.60's GetTaskEvents, serialized (``status`` OK unless refused): pre-selection
        by one task or job id, filters AND-ed, then ``limit`` (negative or unset: none) over
        the newest-first order.  Attempts the limit cuts count as truncated and as dropped
        (status updates and profile events), so the state API says the list is incomplete.
        ``max_bytes`` bounds the reply's events as ``limit`` does (what would not fit is
        counted the same way, never built).  An unknown filter predicate answers Ray's
        in-reply InvalidArgument.

        Each kept attempt's held bytes go straight into the reply's bytes: no copy into a
        reply message and no serialization of the whole reply."""
        f = request.filters
        limit = request.limit if request.HasField("limit") else -1
        candidates, drops = self._candidates(f)
        states = [(s.predicate, s.state) for s in f.state_filters]
        parts = [_OK_STATUS_FIELD]
        kept = size = filtered = truncated = 0
        full = False
        status_cut = profile_cut = 0
        lengths, short = VARINT_TABLE, VARINT_TABLE_SIZE
        exclude_driver = f.exclude_driver
        # no filter but the driver's (the state API's usual query): the two checks inline
        plain = not (
            states or f.task_filters or f.job_filters or f.actor_filters or f.task_name_filters
        )
        try:
            for held in candidates:
                if plain:
                    if not held.has_info or (
                        exclude_driver and held.kind == common_pb2.DRIVER_TASK
                    ):
                        filtered += 1
                        continue
                elif not _matches(held.events(), f, states, exclude_driver):
                    filtered += 1
                    continue
                wire = b""
                if not full and (limit < 0 or kept < limit):
                    wire = held.data()
                    if max_bytes is not None:
                        size += framed_size(len(wire))
                        full = size > max_bytes
                if full or 0 <= limit <= kept:
                    status_cut += 1 if held.has_state else 0
                    profile_cut += held.profiles
                    truncated += 1
                    continue
                n = len(wire)
                parts.append(_EVENTS_TAG)
                parts.append(lengths[n] if n < short else varint(n))
                parts.append(wire)
                kept += 1
        except _UnknownPredicate as err:
            return gcs_service_pb2.GetTaskEventsReply(
                status=gcs_service_pb2.GcsStatus(
                    code=RayStatusCode.InvalidArgument, message=str(err)
                )
            ).SerializeToString()
        # int32 on the wire: saturate rather than fail
        parts.append(int_field(3, min(drops.profile + profile_cut, _INT32_MAX)))
        parts.append(int_field(4, min(drops.status + status_cut, _INT32_MAX)))
        parts.append(int_field(5, len(candidates)))
        parts.append(int_field(6, filtered))
        parts.append(int_field(7, truncated))
        return b"".join(parts)


def _unindex(index: dict[bytes, set[TaskKey]], owner: bytes, key: TaskKey) -> None:
    keys = index.get(owner)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[owner]


class _UnknownPredicate(Exception):
    pass


def _equal(predicate: int) -> bool:
    """Ray's two predicates; any other value fails the query as Ray's does."""
    if predicate == EQUAL:
        return True
    if predicate == gcs_service_pb2.NOT_EQUAL:
        return False
    name = gcs_service_pb2.FilterPredicate.Name(predicate) if predicate in _PREDICATES else ""
    raise _UnknownPredicate(f"Unknown filter predicate: {name}")


def filter_state(events: gcs_pb2.TaskEvents) -> int:
    """The state Ray's state filter compares: the highest-numbered one reported (NIL when
    none), not the newest by time."""
    return max(events.state_updates.state_ts_ns, default=common_pb2.NIL)


def _matches(
    events: gcs_pb2.TaskEvents,
    f: gcs_service_pb2.GetTaskEventsRequest.Filters,
    states: list[tuple[int, str]],
    exclude_driver: bool,
) -> bool:
    if not events.HasField("task_info"):
        return False  # Ray lists only attempts whose task info arrived
    info = events.task_info
    if exclude_driver and info.type == common_pb2.DRIVER_TASK:
        return False
    for tf in f.task_filters:
        if (events.task_id == tf.task_id) != _equal(tf.predicate):
            return False
    for jf in f.job_filters:
        if (info.job_id == jf.job_id) != _equal(jf.predicate):
            return False
    for af in f.actor_filters:
        if (info.actor_id == af.actor_id) != _equal(af.predicate):
            return False
    for nf in f.task_name_filters:
        if (info.name.lower() == nf.task_name.lower()) != _equal(nf.predicate):
            return False
    if states:
        name = common_pb2.TaskStatus.Name(filter_state(events)).lower()
        for predicate, state in states:
            if (name == state.lower()) != _equal(predicate):
                return False
    return True
