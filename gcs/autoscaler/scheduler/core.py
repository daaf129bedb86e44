"""``schedule()``: Ray 2.60's policy in Ray's order, pure and deterministic.

outdated -> min per type -> max per type -> cluster max -> request_resources ->
placement groups -> tasks/actors -> idle termination. Every decision gets a reason.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from typing import Any

from gcs.autoscaler.scheduler.explain import explain_choice, score_text
from gcs.autoscaler.scheduler.nodes import NodeStatus, Source, WorkNode, from_instance, from_type
from gcs.autoscaler.scheduler.packing import LaunchNote, PackContext, try_schedule
from gcs.autoscaler.scheduler.resources import memory_text, shape_text
from gcs.autoscaler.scheduler.termination import enforce_idle, is_leaving, mark, select_excess
from gcs.autoscaler.scheduler.types import (
    SCHEDULABLE_STATUSES,
    ClusterConstraint,
    Decision,
    GangRequest,
    InstanceStatus,
    IpprStatus,
    NodeKind,
    Resize,
    ResourceDemand,
    SchedulingInput,
    SchedulingReply,
    TerminationCause,
)
from gcs.autoscaler.scheduler.waiting import (
    WaitingDemand,
    WaitKind,
    WaitReason,
    gang_verdict,
    unplaced_verdict,
)


def combine_affinity(bundles: tuple[ResourceDemand, ...]) -> list[tuple[ResourceDemand, int]]:
    """Ray's ``combine_requests_with_affinity``: STRICT_PACK bundles become one request."""
    out: list[tuple[ResourceDemand, int]] = []
    merged: dict[tuple, list[ResourceDemand]] = {}
    for b in bundles:
        if b.affinity is None:
            out.append((b, b.count))
            continue
        merged.setdefault((b.affinity, b.selectors), []).extend([b] * b.count)
    for (aff, _), parts in merged.items():
        total: dict[str, float] = defaultdict(float)
        for p in parts:
            for k, v in p.resources.items():
                total[k] += v
        out.append((ResourceDemand(dict(total), 1, parts[0].selectors, affinity=aff), 1))
    return out


class _Round:
    """State of one scheduling round (private; created and dropped by ``schedule``)."""

    def __init__(self, inp: SchedulingInput) -> None:
        self.inp = inp
        self.cfg = inp.config
        self.opts = inp.config.options
        self.reasons: list[Decision] = []
        self.notes: list[LaunchNote] = []
        self.waiting: list[WaitingDemand] = []
        self._limited_memo: tuple[list[WorkNode], dict[str, str]] | None = None
        blocked: dict[str, str] = {}
        ttl = self.opts.unavailable_type_ttl_s
        if ttl is not None:
            for f in inp.launch_failures:
                if inp.now_s - f.at_s < ttl:
                    why = f"is unavailable: a launch failed less than {ttl:g} s ago"
                    blocked[f.node_type] = why
        for node_type, why in inp.unavailable_types.items():
            blocked[node_type] = f"is unavailable ({why})"
        self.blocked_why = blocked
        self.blocked = frozenset(blocked)
        self.pack = PackContext(
            configs=self.cfg.node_types,
            max_num_nodes=self.cfg.max_num_nodes,
            cloud_availability=inp.cloud_availability,
            recoverable_availability=inp.recoverable_availability,
            conserve_gpu=self.opts.conserve_gpu_nodes,
            blocked_types=self.blocked,
        )
        self.nodes: list[WorkNode] = []
        configs = dict(self.cfg.node_types)
        for inst in inp.instances:
            if inst.status not in SCHEDULABLE_STATUSES:
                continue
            node = from_instance(inst, configs, not self.cfg.disable_launch_config_check)
            if node is None:
                continue
            if node.status is NodeStatus.TO_TERMINATE:
                mark(
                    node,
                    TerminationCause.OUTDATED,
                    f"node type {inst.node_type!r} is no longer configured",
                )
            self.nodes.append(node)
        self.last_work = dict(inp.last_work_s)
        if self.opts.own_idle_clock:
            self._apply_own_idle_clock()

    def protected(self, node: WorkNode) -> bool:
        label = self.opts.do_not_disrupt_label
        return label is not None and bool(label) and node.labels.get(label) == "true"

    def _apply_own_idle_clock(self) -> None:
        now = self.inp.now_s
        for n in self.nodes:
            if n.instance is None or not n.is_running:
                continue
            iid = n.instance_id
            busy = any(n.avail[Source.DEMAND].get(k, 0) < v for k, v in n.total.items())
            if busy:
                self.last_work[iid] = now
            elif iid not in self.last_work:
                self.last_work[iid] = now - n.idle_duration_ms / 1000
            n.idle_duration_ms = round(max(0.0, now - self.last_work[iid]) * 1000)

    # -- pipeline steps ---------------------------------------------------------------
    def terminate_outdated(self) -> None:
        if self.cfg.disable_launch_config_check:
            return
        for n in self.nodes:
            if n.status is not NodeStatus.SCHEDULABLE:
                continue
            cfg = self.cfg.node_types.get(n.node_type)
            if cfg is None:
                why = f"node type {n.node_type!r} is no longer configured"
            elif cfg.launch_config_hash and cfg.launch_config_hash != n.launch_config_hash:
                old = n.launch_config_hash or "-"
                why = f"launch config changed ({old} != {cfg.launch_config_hash})"
            else:
                continue
            if n.kind is NodeKind.HEAD:
                self.reasons.append(
                    Decision(
                        "keep", n.instance_id, f"head is outdated ({why}) but never terminated"
                    )
                )
                continue
            mark(n, TerminationCause.OUTDATED, why)

    def enforce_min_workers(self) -> None:
        count: dict[str, int] = defaultdict(int)
        for n in self.nodes:
            if n.status is not NodeStatus.TO_TERMINATE:
                count[n.node_type] += 1
        new: list[WorkNode] = []
        for name, cfg in self.cfg.node_types.items():
            missing = cfg.min_workers - count[name]
            if missing > 0:
                new.extend(from_type(cfg) for _ in range(missing))  # distinct nodes, not aliases
                self.reasons.append(
                    Decision(
                        "launch",
                        name,
                        f"launch {missing} x {name}: min_workers of {name} is "
                        f"{cfg.min_workers}, have {count[name]}",
                    )
                )
        self.nodes = new + self.nodes

    def enforce_max_per_type(self) -> None:
        """Terminate a type's nodes beyond its max_workers.

        The surplus is over the nodes that stay: a node already leaving (``is_leaving``)
        neither counts toward it nor is chosen again.  Ray 2.60 keeps the same nodes by
        accident (its leaving nodes have no Ray node id, so they sort first and are chosen
        again, a no-op); ours carry their Ray node id and sort last, so counting them
        terminated as many running nodes more (10 running + 2 leaving, max 10: 8 left)."""
        terminating = [n for n in self.nodes if n.status is NodeStatus.TO_TERMINATE]
        by_type: dict[str, list[WorkNode]] = {}
        for n in self.nodes:
            if n.status is not NodeStatus.TO_TERMINATE:
                by_type.setdefault(n.node_type, []).append(n)
        for name, group in by_type.items():
            cfg = self.cfg.node_types.get(name)
            if cfg is None:
                continue  # Ray raises KeyError here; an unknown type has no per-type cap
            if len(group) <= cfg.max_workers:
                continue  # the common case, without looking at each node
            staying = [n for n in group if not is_leaving(n)]
            excess = len(staying) - cfg.max_workers
            if excess <= 0:
                continue
            leaving = [n for n in group if is_leaving(n)]
            why = f"{len(staying)} nodes of {name} > max_workers {cfg.max_workers}"
            gone, kept = select_excess(
                staying,
                excess,
                TerminationCause.MAX_NUM_NODE_PER_TYPE,
                why + _also_leaving(len(leaving)),
                lambda _n: False,
            )
            by_type[name] = kept + leaving
            terminating.extend(gone)
            self._note_unlaunched(gone, f"max_workers of {name} is {cfg.max_workers}")
        self.nodes = terminating + [n for g in by_type.values() for n in g]

    def enforce_max_global(self) -> None:
        """Terminate nodes beyond max_num_nodes; as per type, the surplus is over the nodes
        that stay (the head counts and is never chosen; a leaving node neither)."""
        cap = self.cfg.max_num_nodes
        terminating = [n for n in self.nodes if n.status is NodeStatus.TO_TERMINATE]
        alive = [n for n in self.nodes if n.status is not NodeStatus.TO_TERMINATE]
        if not cap or len(alive) <= cap:
            return  # the common case, without looking at each node again
        staying = [n for n in alive if not is_leaving(n)]
        if len(staying) <= cap:
            return
        leaving = [n for n in alive if is_leaving(n)]
        gone, kept = select_excess(
            staying,
            len(staying) - cap,
            TerminationCause.MAX_NUM_NODES,
            f"{len(staying)} nodes > max_num_nodes {cap}" + _also_leaving(len(leaving)),
            lambda _n: False,
        )
        self._note_unlaunched(gone, f"max_num_nodes is {cap}")
        self.nodes = terminating + gone + kept + leaving

    def _note_unlaunched(self, gone: list[WorkNode], why: str) -> None:
        per: dict[str, int] = defaultdict(int)
        for n in gone:
            if n.instance is None:
                per[n.node_type] += 1
        for t, c in per.items():
            self.reasons.append(
                Decision("skip", t, f"not launching {c} x {t} for min_workers: {why}")
            )

    def schedule_constraints(self) -> list[ClusterConstraint]:
        infeasible = []
        for c in self.inp.constraints:
            res = try_schedule(
                self.nodes, [(b, b.count) for b in c.bundles], Source.CONSTRAINT, self.pack
            )
            if res.leftover:
                infeasible.append(c)
                left = ", ".join(f"{n} x {shape_text(d.resources)}" for d, n in res.leftover)
                verdict, why = self.gang_verdict(
                    [(b, b.count) for b in c.bundles], Source.CONSTRAINT
                )
                self.reasons.append(
                    Decision(
                        verdict.value,
                        "request_resources",
                        f"constraint cannot be met ({left} do not fit: {why}); nothing "
                        "launched for it",
                    )
                )
                self._wait(WaitKind.CONSTRAINT, c.bundles, verdict, why, "request_resources")
                continue
            self.nodes = res.nodes
            self.notes.extend(res.launches)
        return infeasible

    def schedule_gangs(self) -> list[GangRequest]:
        def key(g: GangRequest) -> tuple[int, int]:
            constraints = sum(b.count for b in g.bundles if b.affinity or b.anti_affinity)
            return (constraints, sum(b.count for b in g.bundles))

        infeasible = []
        for g in sorted(self.inp.gangs, key=key, reverse=True):
            placed = self._replace_lost_bundles(g)
            if placed is not None:
                if not placed:
                    infeasible.append(g)
                    if g.bundles[0].anti_affinity is None:  # STRICT_PACK: only with survivors
                        verdict = WaitReason.INFEASIBLE
                        why = "lost bundles must join the survivors' nodes, which lack room"
                    else:
                        verdict, why = self.gang_verdict(combine_affinity(g.bundles), Source.DEMAND)
                    self._wait(WaitKind.PLACEMENT_GROUP, g.bundles, verdict, why, g.details)
                continue
            options = [g.bundles] + (list(g.fallbacks) if self.opts.gang_fallbacks else [])
            for bundles in options:
                res = try_schedule(self.nodes, combine_affinity(bundles), Source.DEMAND, self.pack)
                if not res.leftover:
                    self.nodes = res.nodes
                    self.notes.extend(res.launches)
                    break
            else:
                infeasible.append(g)
                verdict, why = self.gang_verdict(combine_affinity(g.bundles), Source.DEMAND)
                self.reasons.append(
                    Decision(
                        verdict.value,
                        g.details or "placement group",
                        f"gang cannot be placed as a whole within node type limits: {why}",
                    )
                )
                self._wait(WaitKind.PLACEMENT_GROUP, g.bundles, verdict, why, g.details)
        return infeasible

    def gang_verdict(
        self, groups: list[tuple[ResourceDemand, int]], source: Source
    ) -> tuple[WaitReason, str]:
        """Why a gang or constraint did not place: the packer tries it once more with no
        node-type or cluster limit (and no type held back); if it places then, a limit
        stopped it."""
        unlimited = replace(
            self.pack,
            configs={n: replace(c, max_workers=1 << 30) for n, c in self.cfg.node_types.items()},
            max_num_nodes=None,
            blocked_types=frozenset(),
        )
        fits = not try_schedule(self.nodes, groups, source, unlimited).leftover
        return gang_verdict(
            [d for d, _ in groups], fits, self.limited(), self.blocked_why, self.cluster_full()
        )

    def _wait(
        self,
        kind: WaitKind,
        bundles: tuple[ResourceDemand, ...],
        verdict: WaitReason,
        why: str,
        details: str,
    ) -> None:
        """One waiting gang or constraint, shown by its largest bundle."""
        if not bundles:
            return
        big = max(bundles, key=lambda b: sum(b.resources.values()))
        self.waiting.append(WaitingDemand(kind, dict(big.resources), 1, verdict, why, "", details))

    def _replace_lost_bundles(self, g: GangRequest) -> bool | None:
        """ray#40212 (option): place a RESCHEDULING group's lost bundles relative to the
        nodes holding its surviving bundles. None = not applicable (Ray's way is used),
        else whether the lost bundles were placed.
        """
        if not (self.opts.lost_bundle_replacement and g.rescheduling and g.bundles):
            return None
        label = next(
            (b.affinity or b.anti_affinity for b in g.bundles if b.affinity or b.anti_affinity),
            None,
        )
        ids = set(g.survivor_nodes)
        survivors = [
            i
            for i, n in enumerate(self.nodes)
            if n.instance is not None
            and (
                (label is not None and n.labels.get(label[0]) == label[1])
                or n.instance_id in ids
                or (n.ray_node_id and n.ray_node_id in ids)
            )
        ]
        if not survivors or label is None:
            return None  # nothing known about the survivors, or no strict strategy
        names = ", ".join(self.nodes[i].instance_id for i in survivors)
        who = g.details or "placement group"
        lost = "; ".join(f"{b.count} x {shape_text(b.resources)}" for b in g.bundles)
        if g.bundles[0].anti_affinity is not None:
            nodes = list(self.nodes)
            for i in survivors:
                if nodes[i].labels.get(label[0]) != label[1]:
                    nodes[i] = nodes[i].clone()
                    nodes[i].labels[label[0]] = label[1]
            res = try_schedule(nodes, combine_affinity(g.bundles), Source.DEMAND, self.pack)
            if res.leftover:
                self.reasons.append(
                    Decision(
                        "infeasible",
                        who,
                        f"lost bundles ({lost}) of a STRICT_SPREAD group need nodes other "
                        f"than {names} (holding its surviving bundles) within node type limits",
                    )
                )
                return False
            self.nodes = res.nodes
            self.notes.extend(res.launches)
            self.reasons.append(
                Decision("replace", who, f"lost bundles ({lost}) placed away from {names}")
            )
            return True
        # STRICT_PACK: the lost bundles must join the survivors; no new node can host them.
        sub = [self.nodes[i] for i in survivors]
        pack = replace(self.pack, blocked_types=frozenset(self.cfg.node_types))
        res = try_schedule(sub, combine_affinity(g.bundles), Source.DEMAND, pack)
        if res.leftover:
            free = ", ".join(
                f"{n.instance_id} {shape_text(n.avail[Source.DEMAND])}"
                + (" (leaving)" if n.status is NodeStatus.TO_TERMINATE else "")
                for n in sub
            )
            self.reasons.append(
                Decision(
                    "infeasible",
                    who,
                    f"lost bundles ({lost}) of a STRICT_PACK group must join its surviving "
                    f"bundles on {names}, which lack room (free: {free}); a new node cannot "
                    "host them",
                )
            )
            return False
        for i, node in zip(survivors, res.nodes, strict=True):
            self.nodes[i] = node
        self.reasons.append(
            Decision("replace", who, f"lost bundles ({lost}) placed with the survivors on {names}")
        )
        return True

    def schedule_demand(self) -> list[ResourceDemand]:
        res = try_schedule(
            self.nodes, [(d, d.count) for d in self.inp.demands], Source.DEMAND, self.pack
        )
        self.nodes = res.nodes
        self.notes.extend(res.launches)
        out = []
        limited, full = self.limited(), self.cluster_full()
        for d, n in res.leftover:
            out.append(ResourceDemand(d.resources, n, d.selectors, d.affinity, d.anti_affinity))
            verdict, why = unplaced_verdict(
                d, n, self.cfg.node_types, limited, self.blocked_why, full
            )
            self.reasons.append(Decision(verdict.value, shape_text(d.resources), why))
            self.waiting.append(
                WaitingDemand(WaitKind.TASKS, d.resources, n, verdict, why, selectors=d.selectors)
            )
        self._waiting_on_new_nodes()
        return out

    def _waiting_on_new_nodes(self) -> None:
        """Task demand placed on nodes not running Ray yet (launched this round or earlier)
        waits for those nodes to come up."""
        mine = {id(d) for d in self.inp.demands}
        per: dict[int, tuple[ResourceDemand, int, dict[str, int]]] = {}
        for n in self.nodes:
            if n.is_running or n.status is NodeStatus.TO_TERMINATE or not n.placed[Source.DEMAND]:
                continue
            for d, k in n.placed[Source.DEMAND]:
                if id(d) not in mine:
                    continue
                _, total, types = per.get(id(d), (d, 0, {}))
                types[n.node_type] = types.get(n.node_type, 0) + 1
                per[id(d)] = (d, total + k, types)
        for d, k, types in per.values():
            nodes = ", ".join(f"{c} x {t}" for t, c in types.items())
            why = f"{k} pending {shape_text(d.resources)} requests wait for {nodes} being added"
            self.waiting.append(
                WaitingDemand(
                    WaitKind.TASKS,
                    d.resources,
                    k,
                    WaitReason.PENDING_CAPACITY,
                    why,
                    selectors=d.selectors,
                )
            )

    def limited(self) -> dict[str, str]:
        """Node types a limit stops from launching now, with why.  Counting looks at every
        node, so it is kept until ``self.nodes`` is replaced (every placement replaces the
        list; the memo holds it, so its identity cannot be reused): many unplaced gangs
        in a row cost one count, not one each."""
        memo = self._limited_memo
        if memo is not None and memo[0] is self.nodes:
            return memo[1]
        count: dict[str, int] = defaultdict(int)
        for n in self.nodes:
            if n.status is not NodeStatus.TO_TERMINATE:
                count[n.node_type] += 1
        out = {
            name: f"is at max_workers {cfg.max_workers}"
            for name, cfg in self.cfg.node_types.items()
            if count[name] >= cfg.max_workers
        }
        self._limited_memo = (self.nodes, out)
        return out

    def excluded(self) -> dict[str, str]:
        """Node types that cannot be launched now, with why (for the reasons)."""
        return {**self.limited(), **self.blocked_why}

    def cluster_full(self) -> str | None:
        cap = self.cfg.max_num_nodes
        alive = sum(1 for n in self.nodes if n.status is not NodeStatus.TO_TERMINATE)
        if cap and alive >= cap:
            return f"is at max_workers {cap - 1} (plus the head)"
        return None

    def pending_idle(self) -> dict[str, tuple[float, ...]]:
        """Ray keeps per-type clocks for unneeded pending nodes; we carry them in the reply."""
        timeout = self.cfg.pending_idle_timeout_s
        if timeout is None:
            return {}
        rank = {
            InstanceStatus.QUEUED: 0,
            InstanceStatus.ALLOCATED: 1,
            InstanceStatus.RAY_INSTALLING: 2,
        }
        by_type: dict[str, list[WorkNode]] = defaultdict(list)
        for n in self.nodes:
            if (
                n.status is NodeStatus.SCHEDULABLE
                and n.kind is NodeKind.WORKER
                and n.im_status in rank
                and not n.placed[Source.DEMAND]
                and not n.placed[Source.CONSTRAINT]
            ):
                by_type[n.node_type].append(n)
        clocks: dict[str, tuple[float, ...]] = {}
        for t, group in by_type.items():
            old = sorted(self.inp.pending_since_s.get(t, ()))[: len(group)]
            stamps = old + [self.inp.now_s] * (len(group) - len(old))
            group.sort(key=lambda n: rank[n.im_status])  # type: ignore[index]
            for n, ts in zip(group, stamps, strict=True):
                n.idle_duration_ms = round((self.inp.now_s - ts) * 1000)
            clocks[t] = tuple(stamps)
        return clocks

    def budget(self) -> tuple[int, int] | None:
        """The disruption budget and how much of it is spent before idle termination starts
        (None = no budget).

        A budget caps the nodes being disrupted at once, not per round: the nodes already
        on their way out spend it.  Those are the workers leaving from an earlier round
        (RAY_STOP_REQUESTED: a drain is reported a round or more later, so counting per
        round let each round take a whole budget again) and the workers this round already
        terminates (outdated, over max: never held back by the budget, as in Ray, but they
        disrupt all the same).  Karpenter counts alike: allowed = budget(total) - nodes
        being deleted for any reason - nodes not ready.  Ray 2.60 has no budget (its
        scheduler counts a leaving node as present everywhere).  The percentage is of the
        non-head nodes, the leaving ones included: they are still nodes, as Karpenter's
        total keeps nodes marked for deletion."""
        o = self.opts
        if o.disruption_budget_nodes is None and o.disruption_budget_percent is None:
            return None
        limits = []
        if o.disruption_budget_nodes is not None:
            limits.append(o.disruption_budget_nodes)
        workers = spent = 0
        for n in self.nodes:
            if n.kind is NodeKind.WORKER and n.instance is not None:
                workers += 1
                if n.status is NodeStatus.TO_TERMINATE or is_leaving(n):
                    spent += 1
        if o.disruption_budget_percent is not None:
            limits.append(max(1, math.floor(workers * o.disruption_budget_percent / 100)))
        return min(limits), spent

    def idle(self) -> None:
        self._limited_memo = None  # idle termination marks nodes of this very list
        keep: list[tuple[str, str]] = []
        budget = self.budget()
        limit, spent = budget if budget is not None else (None, 0)
        enforce_idle(self.nodes, self.cfg, self.protected, limit, keep, spent)
        for who, why in keep:
            self.reasons.append(Decision("keep", who, f"keep node {who}: {why}"))

    # -- reply ----------------------------------------------------------------------
    def launch_reasons(self, launches: dict[str, int]) -> None:
        by_type: dict[str, list[LaunchNote]] = defaultdict(list)
        for note in self.notes:
            by_type[note.node_type].append(note)
        excluded = self.excluded()
        texts: dict[int, str] = {}  # id(demand) -> its text: a few shapes, many notes
        for t, notes in by_type.items():
            if t not in launches:
                continue
            placed: dict[str, int] = defaultdict(int)
            for note in notes:
                for d, k in note.placed:
                    text = texts.get(id(d))
                    if text is None:
                        text = texts[id(d)] = shape_text(d.resources)
                    placed[text] += k
            what = ", ".join(f"{k} pending {s} requests" for s, k in placed.items())
            first = notes[0]
            others = {k: v for k, v in excluded.items() if k != t}
            why = explain_choice(t, first.placed, first.runner_up, self.cfg.node_types, others)
            text = f"launch {len(notes)} x {t}: {what}; {why}"
            detail = f"{t}: {score_text(first.score)}"
            ru = first.runner_up
            if ru is not None:
                detail += f"; runner-up {ru[0]}: {score_text(ru[1])}"
            spec = self.cfg.node_types[t].ippr
            if spec is not None:
                text += (
                    f"; counted at its IPPR max (CPU {spec.max_cpu:g}, memory "
                    f"{memory_text(spec.max_memory)}) since it can be resized in place once running"
                )
            self.reasons.append(Decision("launch", t, text, detail))

    def resizes(self) -> tuple[Resize, ...]:
        """Ray's ``to_ippr``: every pod with a resize queued and a raylet to sync with."""
        out = []
        for n in self.nodes:
            st = n.ippr
            if st is None or st.k8s_resize_status != "new":
                continue
            reason = n.resize_reason or self._provider_resize_reason(st)
            if not st.has_resize_to_send():
                self.reasons.append(
                    Decision(
                        "skip",
                        n.instance_id,
                        f"resize of {n.instance_id} not sent: no raylet on the pod yet "
                        f"(wanted: {reason})",
                    )
                )
                continue
            out.append(
                Resize(
                    instance_id=n.instance_id,
                    cloud_instance_id=n.instance.cloud_instance_id if n.instance else "",
                    ray_node_id=st.raylet_id,
                    node_type=n.node_type,
                    cpu=float(st.desired_cpu),  # type: ignore[arg-type]
                    memory=float(st.desired_memory),  # type: ignore[arg-type]
                    current_cpu=st.current_cpu,
                    current_memory=st.current_memory,
                    reason=reason,
                )
            )
            self.reasons.append(Decision("resize", n.instance_id, reason))
        return tuple(out)

    @staticmethod
    def _provider_resize_reason(st: IpprStatus) -> str:
        target = f"CPU {st.desired_cpu:g}, memory {memory_text(st.desired_memory)}"  # type: ignore[arg-type,str-format]
        if st.last_failed_at is not None:
            why = st.last_failed_reason or "resize failed"
            return f"revert to {target} after a failed resize ({why}), queued by the provider"
        return f"resize to {target} queued by the provider"

    def reply(self, inf_d, inf_g, inf_c, pending_clocks) -> SchedulingReply:
        launches: dict[str, int] = {}
        for n in self.nodes:
            if n.status is NodeStatus.TO_LAUNCH:
                launches[n.node_type] = launches.get(n.node_type, 0) + 1
        self.launch_reasons(launches)
        resizes = self.resizes()
        terms = tuple(
            n.termination
            for n in self.nodes
            if n.status is NodeStatus.TO_TERMINATE and n.termination
        )
        for t in terms:
            self.reasons.append(
                Decision("terminate", t.instance_id, f"terminate {t.instance_id}: {t.reason}")
            )
        cluster: dict[str, float] = defaultdict(float)
        for n in self.nodes:
            if n.status is not NodeStatus.TO_TERMINATE:
                for k, v in n.total.items():
                    cluster[k] += v
        running_workers = any(n.is_running and n.kind is NodeKind.WORKER for n in self.nodes)
        launch_now = (
            tuple(launches) if self.opts.cold_start_full_batch and not running_workers else ()
        )
        for blocked_type in sorted(self.blocked):
            self.reasons.append(
                Decision(
                    "skip",
                    blocked_type,
                    f"not launching {blocked_type}: it {self.blocked_why[blocked_type]}",
                )
            )
        return SchedulingReply(
            launches=launches,
            terminations=terms,
            infeasible_demands=tuple(inf_d),
            infeasible_gangs=tuple(inf_g),
            infeasible_constraints=tuple(inf_c),
            cluster_resources=dict(cluster),
            reasons=tuple(self.reasons),
            launch_now_types=launch_now,
            last_work_s=self._next_last_work(),
            pending_since_s=pending_clocks,
            unavailable_types=tuple(sorted(self.blocked)),
            resizes=resizes,
            waiting=tuple(self.waiting),
        )

    def _next_last_work(self) -> dict[str, float]:
        if not self.opts.own_idle_clock:
            return {}
        out = {}
        for n in self.nodes:
            if n.instance is None or n.status is NodeStatus.TO_TERMINATE:
                continue
            iid = n.instance_id
            if n.placed[Source.DEMAND]:
                out[iid] = self.inp.now_s
            elif iid in self.last_work:
                out[iid] = self.last_work[iid]
        return out


def _also_leaving(count: int) -> str:
    return f" (and {count} already stopping)" if count else ""


def _cap_work(inp: SchedulingInput) -> tuple[SchedulingInput, list[Decision]]:
    """Apply :attr:`Options.max_work_units`: keep request shapes, then gangs (by bundles), in
    input order while the budget lasts, and say what waits."""
    o = inp.config.options
    per_kind = max(1, o.max_work_units // max(1, len(inp.instances)))
    deferred: list[Decision] = []
    changes: dict[str, Any] = {}
    if len(inp.demands) > per_kind:
        changes["demands"] = inp.demands[:per_kind]
        deferred.append(_deferred("demands", len(inp.demands), per_kind, "request shapes"))
    bundles, keep = 0, 0
    for gang in inp.gangs:
        bundles += max(1, len(gang.bundles))
        if bundles > per_kind and keep > 0:
            break
        keep += 1
    if keep < len(inp.gangs):
        changes["gangs"] = inp.gangs[:keep]
        deferred.append(_deferred("gangs", len(inp.gangs), keep, "placement groups"))
    if len(inp.constraints) > o.max_constraints:
        changes["constraints"] = inp.constraints[: o.max_constraints]
        deferred.append(
            _deferred(
                "constraints", len(inp.constraints), o.max_constraints, "resource constraints"
            )
        )
    return (replace(inp, **changes) if changes else inp), deferred


def _deferred(field: str, total: int, kept: int, what: str) -> Decision:
    return Decision(
        "deferred",
        field,
        f"{total - kept} of {total} {what} wait for a later round (work cap: {kept} this round)",
    )


def schedule(inp: SchedulingInput) -> SchedulingReply:
    """Decide launches, terminations and infeasibility for one round. Pure."""
    inp, deferred = _cap_work(inp)
    r = _Round(inp)
    r.reasons.extend(deferred)
    r.terminate_outdated()
    r.enforce_min_workers()
    r.enforce_max_per_type()
    r.enforce_max_global()
    inf_c = r.schedule_constraints()
    inf_g = r.schedule_gangs()
    inf_d = r.schedule_demand()
    clocks = r.pending_idle()
    r.idle()
    return r.reply(inf_d, inf_g, inf_c, clocks)
