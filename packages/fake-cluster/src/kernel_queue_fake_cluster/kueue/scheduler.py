"""The fake Kueue's scheduler: one pass per affected ClusterQueue, decided by `admission.py`.

Collects each queue's pending and admitted Workloads, asks `admission.schedule` what to admit
and whom to preempt, and writes Kueue's results: `status.admission` with QuotaReserved and
Admitted, Evicted/Preempted on victims, QuotaReserved=False with the release's reason (`Pending`
and `Inadmissible` up to 0.19, `WaitingForQuota`, `ExceedsMaxQuota`, ... from 0.20) and Kueue's
message, the `stopPolicy` rules, and ClusterQueue/LocalQueue status, after Kueue's
`pkg/scheduler`. A deactivated Workload's quota counts no more (`pkg/cache/scheduler/cache.go`).
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernel_queue import admission

from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import pods, queues, releases
from kernel_queue_fake_cluster.kueue import workload as kw
from kernel_queue_fake_cluster.kueue.client import KueueClient, full_name
from kernel_queue_fake_cluster.kueue.webhook import selector_matches

Key = tuple[str, str]
_EPOCH = "1970-01-01T00:00:00Z"


@dataclass
class _Queue:
    """One ClusterQueue's Workloads in a pass."""

    cq: Obj
    pending: list[tuple[Obj, admission.Request, bool]] = field(default_factory=list)
    admitted: list[admission.Admitted] = field(default_factory=list)
    workloads: dict[str, Obj] = field(default_factory=dict)  # request name -> Workload


class Scheduler:
    """Admission by policy (or, with `manual`, only of what `allowed` lets through)."""

    def __init__(self, client: KueueClient, *, manual: bool, release: releases.Release) -> None:
        self.client, self.manual, self.release = client, manual, release
        self.allowed: set[str] = set()  # request names `FakeKueue.admit` let through
        self._sequence: dict[str, int] = {}  # Workload uid -> creation order
        self._requests: dict[str, tuple[str, admission.Request]] = {}  # uid -> (RV, request)

    def saw(self, wl: Obj) -> None:
        """Note a Workload's creation order (the queue's tie-break within one second)."""
        self._sequence.setdefault(wl["metadata"]["uid"], len(self._sequence))

    def request(self, wl: Obj) -> admission.Request:
        """The engine's view: priority, then creationTimestamp, then creation order.

        Cached per Workload version: every pass needs it for every Workload of its queues."""
        meta = wl["metadata"]
        uid, version = meta.get("uid", ""), meta.get("resourceVersion", "")
        cached = self._requests.get(uid)
        if uid and version and cached is not None and cached[0] == version:
            return cached[1]
        created = pods.parse_time(meta["creationTimestamp"]).timestamp()
        created += (self._sequence.get(uid, 0) % 10_000) / 10_000
        request = queues.request(wl, created)
        if uid and version:
            self._requests[uid] = (version, request)
        return request

    def cluster_queues_of(self, wl: Obj) -> set[str]:
        """The ClusterQueues a Workload's change matters to: its LocalQueue's and admission's."""
        held = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
        lq = self.client.get(
            "localqueues", wl["metadata"]["namespace"], wl["spec"].get("queueName", "")
        )
        return {held, ((lq or {}).get("spec") or {}).get("clusterQueue", "")} - {""}

    def pending_order(self, cq_name: str) -> list[tuple[Obj, admission.Request]] | None:
        """Queued Workloads of a ClusterQueue in Kueue's order; None if it does not exist."""
        if self.client.get("clusterqueues", None, cq_name) is None:
            return None
        mine = {
            (lq["metadata"]["namespace"], lq["metadata"]["name"])
            for lq in self.client.objects("localqueues")
            if (lq.get("spec") or {}).get("clusterQueue") == cq_name
        }
        waiting = {
            request.name: (wl, request)
            for wl in self.client.objects("workloads")
            if kw.is_admissible(wl)
            and (wl["metadata"]["namespace"], wl["spec"].get("queueName")) in mine
            for request in [self.request(wl)]
        }
        return [waiting[r.name] for r in admission.order(r for _, r in waiting.values())]

    def schedule(self, dirty: set[str]) -> None:
        """One pass: sort every Workload into its queue, then schedule each dirty queue."""
        local_queues = {
            (q["metadata"]["namespace"], q["metadata"]["name"]): q
            for q in self.client.objects("localqueues")
        }
        cluster_queues = {q["metadata"]["name"]: q for q in self.client.objects("clusterqueues")}
        flavors = {f["metadata"]["name"] for f in self.client.objects("resourceflavors")}
        passes = {name: _Queue(cluster_queues[name]) for name in dirty if name in cluster_queues}
        by_lq: dict[Key, list[Obj]] = {}
        # Stored objects are read in place; a Workload is copied only where a pass may write it
        # (copying every Workload on every pass made 300 pod groups quadratic).
        for stored in self.client.objects("workloads"):
            if kw.is_finished(stored):
                continue
            wl = stored
            ns, queue = wl["metadata"]["namespace"], wl["spec"].get("queueName", "")
            lq = local_queues.get((ns, queue))
            cq_name = ((lq or {}).get("spec") or {}).get("clusterQueue", "")
            wl = self._restarted(wl, lq, cluster_queues.get(cq_name))
            by_lq.setdefault((ns, queue), []).append(wl)
            if kw.has_reservation(wl):
                held = wl["status"]["admission"]["clusterQueue"]
                wl = self._drain(wl, lq, cluster_queues.get(held))
                # `HasActiveQuotaReservation`: Kueue's cache drops a deactivated Workload's
                # usage as soon as it sees `active: false`, while its pods still stop.
                if held in passes and kw.is_active(wl):
                    reserved = kw.condition(wl, k.QUOTA_RESERVED) or {}
                    since = pods.parse_time(reserved.get("lastTransitionTime") or _EPOCH)
                    flavors_held = queues.admitted_flavors(wl)
                    evicting = kw.is_evicted(wl)
                    entry = admission.Admitted(
                        self.request(wl), flavors_held, since.timestamp(), evicting
                    )
                    passes[held].admitted.append(entry)
                    passes[held].workloads[entry.request.name] = wl
            elif kw.is_admissible(wl):
                blocker = _blocker(queue, lq, cq_name, cluster_queues.get(cq_name))
                if blocker is not None:
                    self._pending(wl, *blocker)
                if cq_name in passes:
                    wl = copy.deepcopy(wl)
                    request = self.request(wl)
                    passes[cq_name].pending.append((wl, request, blocker is not None))
                    passes[cq_name].workloads[request.name] = wl
        for _, queue_pass in sorted(passes.items()):
            self._schedule_queue(queue_pass, flavors)
        for name in sorted(dirty):
            self._statuses(name, cluster_queues.get(name), local_queues, by_lq, flavors)

    def _schedule_queue(self, queue: _Queue, flavors: set[str]) -> None:
        cq, name = queue.cq, queue.cq["metadata"]["name"]
        engine = queues.engine_queue(cq)
        inactive = not set(queues.flavor_names(cq)) <= flavors
        selector = (cq.get("spec") or {}).get("namespaceSelector")
        candidates = []
        for wl, request, blocked in queue.pending:
            if blocked:
                continue
            namespace = self.client.get("namespaces", None, wl["metadata"]["namespace"])
            labels = queues.namespace_labels(namespace or {"metadata": {"name": ""}})
            if inactive:
                self._pending(wl, releases.INACTIVE, f"ClusterQueue {name} is inactive")
            elif not selector_matches(selector, labels):
                self._pending(wl, releases.NAMESPACE, self.release.namespace_mismatch)
            elif not self.manual or request.name in self.allowed:
                candidates.append(request)
        if not candidates:
            return
        decision = admission.schedule(engine, candidates, queue.admitted)
        granted = []
        for grant in decision.admit:
            wl = queue.workloads[grant.name]
            self._reserve(wl, name, grant.flavors)
            self.allowed.discard(grant.name)
            granted.append(admission.Admitted(self.request(wl), grant.flavors, 0.0))
        for preemption in decision.preempt:
            victim, preemptor = preemption.victim, preemption.preemptor
            self.preempt(queue.workloads[victim], queue.workloads[preemptor], cq)
        used = admission.usage([*queue.admitted, *granted])
        unfit = {u.name: u for u in decision.unfit}
        done = {grant.name for grant in decision.admit}
        for request in (r for r in candidates if r.name not in done):
            wl = queue.workloads[request.name]
            found = queues.pending_message(wl, engine, used, unfit.get(request.name))
            if found is None:
                continue
            why, message = found
            if request.name in decision.waiting_for:
                count = len(decision.waiting_for[request.name])
                why, message = releases.PREEMPTING, f"{message}. Pending the preemption of "
                message += f"{count} workload(s)"
            self._pending(wl, why, message)

    def _reserve(self, wl: Obj, cq: str, flavors: Mapping[str, str]) -> None:
        """Quota reserved and admitted (no admission checks), with the scheduler's events."""
        requeued = kw.condition(wl, k.REQUEUED) or {}
        queued = requeued.get("lastTransitionTime") or wl["metadata"]["creationTimestamp"]
        kw.reserve(wl, {"clusterQueue": cq, "podSetAssignments": queues.assignments(wl, flavors)})
        self.client.write_status(wl)
        waited = int((_now() - pods.parse_time(queued)).total_seconds())
        message = f"Quota reserved in ClusterQueue {cq}, wait time since queued was {waited}s"
        self.client.event(wl, "Normal", "QuotaReserved", message)
        message = f"Admitted by ClusterQueue {cq}, wait time since reservation was 0s"
        self.client.event(wl, "Normal", "Admitted", message)

    def preempt(self, victim: Obj, preemptor: Obj | None, cq: Obj) -> None:
        """Evicted=Preempted + Preempted=InClusterQueue with Kueue's message and events."""
        if kw.is_evicted(victim):
            return
        victim = copy.deepcopy(victim)  # may be the stored object itself
        by = preemptor or {"metadata": {"uid": "UNKNOWN"}, "spec": {}}
        message = kw.preemption_message(by, queues.cq_path(cq))
        kw.preempt(victim, k.IN_CLUSTER_QUEUE, message)
        self.client.write_status(victim)
        self.client.event(victim, "Normal", "EvictedDueTo" + k.PREEMPTED, message)
        mine, theirs = (int(wl["spec"].get("priority") or 0) for wl in (victim, by))
        levels = (
            f"; preemptor effective priority: {theirs} (base: {theirs}, boost: 0); "
            f"preemptee effective priority: {mine} (base: {mine}, boost: 0)"
        )
        self.client.event(victim, "Normal", "Preempted", message + levels)
        if preemptor is not None:
            uid, cq_name = victim["metadata"]["uid"], cq["metadata"]["name"]
            text = f"Preempted workload {full_name(victim)} (UID: {uid}) in ClusterQueue {cq_name}"
            self.client.event(preemptor, "Normal", "PreemptedWorkload", text + levels)

    def evict(self, wl: Obj, reason: str, message: str) -> None:
        kw.evict(wl, reason, message)
        self.client.write_status(wl)
        self.client.event(wl, "Normal", "EvictedDueTo" + reason, message)

    def _pending(self, wl: Obj, why: str, message: str) -> None:
        """QuotaReserved=False with the release's reason for `why` (`releases.QUOTA`, ...); a
        Warning event when it changes."""
        reason = self.release.reason(why)
        found = kw.condition(wl, k.QUOTA_RESERVED) or {}
        if (found.get("reason"), found.get("message")) != (reason, message):
            wl = copy.deepcopy(wl)  # may be the stored object itself
            kw.unreserve(wl, reason, message)
            self.client.write_status(wl)
            self.client.event(wl, "Warning", reason, message)

    def _drain(self, wl: Obj, lq: Obj | None, cq: Obj | None) -> Obj:
        """`stopPolicy: HoldAndDrain` evicts the admitted Workloads of a stopped queue.

        Returns the Workload as it now stands (a copy if it was written)."""
        for queue, reason, message in (
            (cq, k.CLUSTER_QUEUE_STOPPED, "The ClusterQueue is stopped"),
            (lq, k.LOCAL_QUEUE_STOPPED, "The LocalQueue is stopped"),
        ):
            policy = ((queue or {}).get("spec") or {}).get("stopPolicy")
            if policy == "HoldAndDrain" and not kw.is_evicted(wl):
                wl = copy.deepcopy(wl)
                self.evict(wl, reason, message)
        return wl

    def _restarted(self, wl: Obj, lq: Obj | None, cq: Obj | None) -> Obj:
        """A queue back to `stopPolicy: None` requeues what its stop evicted.

        Returns the Workload as it now stands (a copy if it was written)."""
        requeued = kw.condition(wl, k.REQUEUED) or {}
        if requeued.get("status") != "False":
            return wl
        for queue, stopped, reason, what in (
            (lq, k.LOCAL_QUEUE_STOPPED, k.LOCAL_QUEUE_RESTARTED, "LocalQueue"),
            (cq, k.CLUSTER_QUEUE_STOPPED, k.CLUSTER_QUEUE_RESTARTED, "ClusterQueue"),
        ):
            if (
                requeued.get("reason") == stopped
                and queue is not None
                and not queues.stopped(queue)
            ):
                message = f"The {what} was restarted after being stopped"
                wl = copy.deepcopy(wl)
                kw.set_condition(wl, k.REQUEUED, True, reason, message)
                self.client.write_status(wl)
        return wl

    def _statuses(
        self,
        name: str,
        cq: Obj | None,
        local_queues: dict[Key, Obj],
        by_lq: dict[Key, list[Obj]],
        flavors: set[str],
    ) -> None:
        """ClusterQueue and LocalQueue status: counters, flavor usage, the Active condition."""
        mine = {
            lq_key: lq
            for lq_key, lq in local_queues.items()
            if (lq.get("spec") or {}).get("clusterQueue") == name
        }
        pending = {q: sum(kw.is_admissible(wl) for wl in by_lq.get(q, [])) for q in mine}
        active = (True, "Ready", "Can admit new workloads")
        if cq is not None:
            missing = [f for f in queues.flavor_names(cq) if f not in flavors]
            why = [("Stopped", "is stopped")] if queues.stopped(cq) else []
            if missing:
                why.append(
                    ("FlavorNotFound", f"references missing ResourceFlavor(s): {','.join(missing)}")
                )
            if why:
                active = (
                    False,
                    why[0][0],
                    f"Can't admit new workloads: {', '.join(w for _, w in why)}.",
                )
            held = [wl for wls in by_lq.values() for wl in wls if _held_in(wl) == name]
            status = queues.queue_status(
                cq,
                held,
                pending=sum(pending.values()),
                cq=cq,
                active=active,
                request_of=self.request,
            )
            self._write_status("clusterqueues", None, name, cq, status)
        for (ns, lq_name), lq in mine.items():
            if queues.stopped(lq):
                lq_active = (False, "Stopped", "LocalQueue is stopped")
            elif cq is None or not active[0]:
                reason = "ClusterQueueDoesNotExist" if cq is None else "ClusterQueueIsInactive"
                lq_active = (False, reason, "Can't submit new workloads to clusterQueue")
            else:
                lq_active = (True, "Ready", "Can submit new workloads to localQueue")
            held = [wl for wl in by_lq.get((ns, lq_name), []) if _held_in(wl)]
            count = pending[(ns, lq_name)]
            status = queues.queue_status(
                lq, held, pending=count, cq=cq, active=lq_active, request_of=self.request
            )
            self._write_status("localqueues", ns, lq_name, lq, status)

    def _write_status(
        self, plural: str, ns: str | None, name: str, queue: Obj, status: Obj
    ) -> None:
        if queue.get("status") != status:
            body = {**copy.deepcopy(queue), "status": status}
            self.client.replace(plural, ns, name, body, subresource="status")


def _blocker(queue: str, lq: Obj | None, cq_name: str, cq: Obj | None) -> tuple[str, str] | None:
    """Why the workload controller keeps a Workload out of scheduling, and its message (the same
    from 0.14 to 0.20; `Inadmissible` up to 0.19, `Misconfigured` or `Suspended` from 0.20)."""
    if lq is None:
        return releases.MISSING, f"LocalQueue {queue} is terminating or missing"
    if queues.stopped(lq):
        return releases.STOPPED, f"LocalQueue {queue} is stopped"
    if cq is None:
        return releases.MISSING, f"ClusterQueue {cq_name} is terminating or missing"
    if queues.stopped(cq):
        return releases.STOPPED, f"ClusterQueue {cq_name} is stopped"
    return None


def _held_in(wl: Obj) -> str:
    """The ClusterQueue whose quota the Workload uses ("" when none: not reserved, or
    deactivated)."""
    if not kw.has_reservation(wl) or not kw.is_active(wl):
        return ""
    return str(((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", ""))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
