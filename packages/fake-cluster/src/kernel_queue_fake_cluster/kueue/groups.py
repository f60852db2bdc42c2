"""The fake Kueue's pod group reconciler, one (namespace, Workload) at a time.

Kueue's `ReconcileGenericJob` (`pkg/controller/jobframework/reconciler.go`) step order with the
pod integration's hooks (`pkg/controller/jobs/pod/pod_controller.go`): create or match the
Workload (replacement pods), WaitingForReplacementPods, Finished, deletion, PodsReady, eviction
(TerminationTarget + DELETE, requeue once no pod runs), ungating with the flavor's nodeSelector
and tolerations; plus the workload controller's `spec.active` rule. Admission is the scheduler's.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
from collections.abc import Callable, Sequence

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, now_rfc3339
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import group_status, pods, releases
from kernel_queue_fake_cluster.kueue import workload as kw
from kernel_queue_fake_cluster.kueue.client import G, KueueClient, full_name, key

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, Workload name)


class GroupReconciler:
    """Kueue's pod reconciler for plain pods and pod groups, keyed by Workload."""

    def __init__(
        self,
        client: KueueClient,
        *,
        topology: bool,
        touch: Callable[[Key], None],
        release: releases.Release,
        label_keys_to_copy: Sequence[str] = (),
    ):
        """`touch(key)` asks for `key` to be reconciled again (after a grace period ends);
        `release`: whether Workloads carry PodsReady, the reason after an eviction;
        `label_keys_to_copy`: the pod labels a new Workload gets (`labelKeysToCopy`)."""
        self.client, self.topology, self._touch = client, topology, touch
        self.label_keys_to_copy = tuple(label_keys_to_copy)
        self.release = release
        self.blocked: set[Key] = set()  # groups waiting for their WorkloadPriorityClass
        self._members: dict[Key, set[str]] = {}
        self._pod_keys: dict[Key, Key] = {}
        self._timers: set[Key] = set()

    def index(self, event: str, pod: Obj) -> set[Key]:
        """Track which Workload each managed pod belongs to; return the keys to reconcile."""
        meta, touched = pod["metadata"], set()
        name: Key = key(pod)
        if (old := self._pod_keys.pop(name, None)) is not None:
            self._members.get(old, set()).discard(meta["name"])
            touched.add(old)
        wl_name = pods.workload_name(pod)
        if wl_name is not None and event != "DELETED":
            new = (meta["namespace"], wl_name)
            self._pod_keys[name] = new
            self._members.setdefault(new, set()).add(meta["name"])
            touched.add(new)
        return touched

    def pods(self, group: Key) -> list[Obj]:
        """Copies of the group's managed pods, by name."""
        found = []
        for name in sorted(self._members.get(group, ())):
            pod = self.client.get("pods", group[0], name)
            if pod is not None and (group[0], pods.workload_name(pod)) == group:
                found.append(pod)
        return found

    def reconcile(self, group: Key) -> None:
        members = self.pods(group)
        wl = self.client.workload(*group)
        if wl is not None:
            self._activation(wl)
        if not members:
            if wl is not None:
                self._collect(wl)
        elif wl is None:
            self._create(group, members)
        elif pods.group_name(members[0]) and not _is_group_workload(wl):
            message = (
                f'A Workload named "{group[1]}" already exists but is not a pod group workload; '
                "this pod group cannot be admitted"
            )
            for pod in members:
                self.client.event(pod, "Warning", "WorkloadNameConflict", message)
            self.client.finalize([p for p in members if not pods.runnable_or_succeeded(p)])
        else:
            self._sync(wl, members)

    def _sync(self, wl: Obj, members: list[Obj]) -> None:
        """A group with its Workload, in `ReconcileGenericJob`'s order: WaitingForReplacementPods,
        a finished Workload, a deleted one, pods that finished, PodsReady, eviction, start (gated
        and admitted) and stop (running and not admitted)."""
        group = bool(pods.group_name(members[0]))
        if group:
            kept, absent = self._match(wl, members)
            if not kept:
                self._replace_spec(wl, members)
                return
            members = kept
            self._adopt(wl, members)
            group_status.set_waiting_for_replacement(wl, absent)
        if kw.is_finished(wl):
            self._finalize_finished(wl, members)
        elif wl["metadata"].get("deletionTimestamp"):
            self._stop(members, k.WORKLOAD_DELETED, k.WORKLOAD_DELETED_MESSAGE, everything=True)
            self.client.finalize(self.pods(key(wl)))
            self.client.remove_finalizer(wl)
        elif (done := group_status.finished(members)) is not None:
            kw.finish(wl, *done)
            self._finalize_finished(wl, members)
            message = f"Workload '{full_name(wl)}' is declared finished"
            self.client.event(members[0], "Normal", "FinishedWorkload", message)
        else:
            if self.release.pods_ready:
                group_status.set_pods_ready(wl, members)
            evicted = kw.condition(wl, k.EVICTED)
            if evicted is not None and evicted["status"] == "True":
                self.client.write_status(wl)
                reason = k.EVICTED_STOP_REASON + evicted["reason"]
                self._stop(members, reason, evicted["message"])
                if group:  # the stopped pods are missing now, before the quota is released
                    group_status.set_waiting_for_replacement(
                        wl, self._match(wl, self.pods(key(wl)))[1]
                    )
                self._release(wl, evicted, group)
            elif any(pods.is_suspended(p) for p in members):
                if kw.is_true(wl, k.ADMITTED):
                    self._start(wl, members)
            elif not kw.is_true(wl, k.ADMITTED):
                self._stop(members, k.NOT_ADMITTED, k.NOT_ADMITTED_MESSAGE)
            self.client.write_status(wl)

    def _finalize_finished(self, wl: Obj, members: list[Obj]) -> None:
        """Finished: the pods' finalizers go, then the Workload's (its quota is free)."""
        self.client.write_status(wl)
        self.client.finalize(members)
        self.client.remove_finalizer(wl)

    def _activation(self, wl: Obj) -> None:
        """The `spec.active` rule of Kueue's workload controller
        (`pkg/controller/core/workload_controller.go`): `active: false` evicts as Deactivated and
        holds the Workload out of the queue; `true` again marks it Requeued, Reactivated."""
        if not kw.is_active(wl) and not kw.is_evicted(wl):
            had_admission = bool((wl.get("status") or {}).get("admission"))
            kw.evict(wl, k.DEACTIVATED, k.DEACTIVATED_MESSAGE)
            wl["status"].pop("requeueState", None)
            self.client.write_status(wl)
            if had_admission:
                reason = "EvictedDueTo" + k.DEACTIVATED
                self.client.event(wl, "Normal", reason, k.DEACTIVATED_MESSAGE)
        if self.release.granular_reasons and kw.pending_as_deactivated(wl):
            self.client.write_status(wl)
        requeued = kw.condition(wl, k.REQUEUED) or {}
        if kw.is_active(wl) and (requeued.get("status"), requeued.get("reason")) == (
            "False",
            k.DEACTIVATED,
        ):
            kw.set_condition(wl, k.REQUEUED, True, k.REACTIVATED, k.REACTIVATED_MESSAGE)
            self.client.write_status(wl)

    def _create(self, group: Key, members: list[Obj]) -> None:
        """No Workload (steps 3, 3'): finalize a finished group, wait while a pod runs, else
        compose and create the Workload."""
        if group_status.finished(members) is not None:
            self.client.finalize(members)
            return
        if any(pods.is_active(p, _now()) for p in members):
            return
        wl = self._compose(group, members)
        if wl is not None:
            self.client.create("workloads", group[0], wl)
            message = f"Created Workload: {group[0]}/{group[1]}"
            self.client.event(members[0], "Normal", "CreatedWorkload", message)

    def _compose(self, group: Key, members: list[Obj]) -> Obj | None:
        """`ConstructComposableWorkload` + `prepareWorkload`, or None (with Kueue's events)."""
        first = members[0]
        if name := pods.group_name(first):
            runnable = [p for p in members if pods.runnable_or_succeeded(p)]
            self.client.finalize([p for p in members if not pods.runnable_or_succeeded(p)])
            fast = _annotation(first, k.GROUP_FAST_ADMISSION_ANNOTATION) == "true"
            total = pods.total_count(first)
            if not runnable or (not fast and len(runnable) < total):
                message = f"'{name}' group has fewer runnable pods than expected"
                self.client.event(first, "Warning", "ErrWorkloadCompose", message)
                return None
            queue = pods.labels_of(first).get(k.QUEUE_LABEL)
            for pod in runnable:
                count = _annotation(pod, k.GROUP_TOTAL_COUNT_ANNOTATION)
                if pods.labels_of(pod).get(k.QUEUE_LABEL) != queue or count != str(total):
                    log.info("fake Kueue: pods of %s disagree on queue or total count", group)
                    return None
            runnable.sort(key=pods.keep_order_active)
            self._remove_excess(runnable[total:])
            members = runnable[:total]
        priority, priority_class = 0, pods.labels_of(first).get(k.WORKLOAD_PRIORITY_CLASS_LABEL)
        if priority_class:
            found = self.client.get("workloadpriorityclasses", None, priority_class)
            if found is None:
                message = f'WorkloadPriorityClass "{priority_class}" not found'
                self.client.event(first, "Warning", "WorkloadPriorityClassNotFound", message)
                self.blocked.add(group)
                return None
            priority = int(found.get("value", 0))
        try:
            labels = kw.copied(members, self.label_keys_to_copy)
        except ValueError as exc:
            self.client.event(first, "Warning", "ErrWorkloadCompose", str(exc))
            return None
        self.blocked.discard(group)
        return kw.new_workload(
            group[1], members, priority=priority, priority_class=priority_class,
            topology=self.topology, labels=labels,
        )  # fmt: skip

    def _match(self, wl: Obj, members: list[Obj]) -> tuple[list[Obj], int]:
        """`FindMatchingWorkloads`: per role keep up to `count` pods, finalize replaced
        inactive ones, delete excess active ones; return the kept pods and the absent count."""
        fast = _annotation(members[0], k.GROUP_FAST_ADMISSION_ANNOTATION) == "true"
        kept: list[Obj] = []
        replaced: list[Obj] = []
        excess: list[Obj] = []
        absent = 0
        for pod_set in wl["spec"]["podSets"]:
            count = int(pod_set.get("count", 1))
            role = [p for p in members if pods.role_hash(p) == pod_set["name"]]
            active = [p for p in role if pods.runnable_or_succeeded(p)]
            inactive = [p for p in role if not pods.runnable_or_succeeded(p)]
            active.sort(key=pods.keep_order_active)
            inactive.sort(key=pods.keep_order_inactive)
            absent += int(count > 0 and not active) if fast else max(0, count - len(active))
            drop = max(0, min(len(inactive), len(inactive) + len(active) - count))
            kept += active[:count] + inactive[: len(inactive) - drop]
            excess += active[count:]
            replaced += inactive[len(inactive) - drop :]
        if kept:
            self._remove_excess(excess)
            self.client.finalize(replaced)
        return kept, absent

    def _replace_spec(self, wl: Obj, members: list[Obj]) -> None:
        """No pod matches the Workload: while it holds no quota, rebuild its spec from the pods
        (`updateWorkloadToMatchJob`)."""
        new = None if kw.has_reservation(wl) else self._compose(key(wl), members)
        current = self.client.workload(*key(wl))
        if new is not None and current is not None:
            current["spec"] = {**new["spec"], "active": kw.is_active(current)}
            self.client.replace("workloads", *key(wl), current)
            message = f"Updated not matching Workload for suspended job: {full_name(wl)}"
            self.client.event(members[0], "Normal", "UpdatedWorkload", message)

    def _adopt(self, wl: Obj, members: list[Obj]) -> None:
        """`EnsureWorkloadOwnedByAllMembers`: a non-controller owner reference per pod."""
        current = self.client.workload(*key(wl))
        if current is None:
            return
        owners = current["metadata"].setdefault("ownerReferences", [])
        uids = {ref.get("uid") for ref in owners}
        added = [pod for pod in members if pod["metadata"]["uid"] not in uids]
        if added:
            owners += [kw.owner_reference(pod, controller=False) for pod in added]
            self.client.replace("workloads", *key(wl), current)
            message = f"Added {len(added)} owner reference(s)"
            self.client.event(wl, "Normal", "OwnerReferencesAdded", message)

    def _release(self, wl: Obj, evicted: Obj, group: bool) -> None:
        """Step 6 after the stop: once no pod runs, Requeued and the reservation dropped."""
        if not kw.has_reservation(wl):
            return
        members, now = self.pods(key(wl)), _now()
        if any(pods.is_active(p, now) for p in members):
            self._recheck_after_grace(key(wl), members)
            return
        requeue = evicted["reason"] in k.REQUEUE_ON and group
        kw.set_condition(wl, k.REQUEUED, requeue, evicted["reason"], evicted["message"])
        kw.unreserve(wl, self.release.reason(releases.EVICTED), evicted["message"])
        if self.release.pods_ready:
            kw.set_condition(wl, k.PODS_READY, False, k.WAIT_FOR_START, k.NOT_READY_MESSAGE)

    def _start(self, wl: Obj, members: list[Obj]) -> None:
        """`Run` → `prepare` on each gated pod: flavor nodeLabels and tolerations, Kueue's
        labels, gates removed; a nodeSelector conflict finishes the Workload (FailedToStart)."""
        admitted = wl["status"]["admission"]
        cq = admitted["clusterQueue"]
        for pod in members:
            name = pods.role_hash(pod) if pods.group_name(pod) else k.DEFAULT_POD_SET_NAME
            assigned = [a for a in admitted["podSetAssignments"] if a["name"] == name]
            if not pods.is_gated(pod) or not assigned:
                continue
            spec, labels = pod["spec"], pod["metadata"].setdefault("labels", {})
            selector = dict(spec.get("nodeSelector") or {})
            tolerations = list(spec.get("tolerations") or [])
            for flavor_name in dict.fromkeys((assigned[0].get("flavors") or {}).values()):
                flavor = (self.client.get("resourceflavors", None, flavor_name) or {}).get("spec")
                for label, value in ((flavor or {}).get("nodeLabels") or {}).items():
                    if selector.setdefault(label, value) != value:
                        kw.finish(wl, k.FAILED_TO_START, _conflict(label, selector[label], value))
                        return
                tolerations += [
                    t for t in (flavor or {}).get("tolerations") or [] if t not in tolerations
                ]
            if selector:
                spec["nodeSelector"] = selector
            if tolerations:
                spec["tolerations"] = tolerations
            labels[k.PODSET_LABEL] = name
            labels[k.LOCAL_QUEUE_LABEL] = wl["spec"].get("queueName", "")
            if re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", cq) and len(cq) <= 63:
                labels[k.CLUSTER_QUEUE_LABEL] = cq
            if self.topology:
                annotations = pod["metadata"].setdefault("annotations", {})
                annotations[k.WORKLOAD_ANNOTATION] = wl["metadata"]["name"]
            kueue_gates = (k.ADMISSION_GATE, k.TOPOLOGY_GATE)
            gates = [
                g for g in spec.get("schedulingGates") or [] if g.get("name") not in kueue_gates
            ]
            spec["schedulingGates"] = gates
            self.client.store.replace("", "pods", *key(pod), pod)
            self.client.event(pod, "Normal", "Started", f"Admitted by clusterQueue {cq}")

    def _stop(
        self, members: list[Obj], reason: str, message: str, *, everything: bool = False
    ) -> None:
        """`Pod.Stop`: TerminationTarget on the pod's status, a DELETE with the pod's own grace,
        event Stopped; skips terminating pods and, unless `everything`, finished or gated ones."""
        for pod in members:
            if pods.deleting(pod) or (not everything and pods.is_suspended(pod)):
                continue
            status = pod.setdefault("status", {})
            conditions = status.get("conditions") or []
            target = {"type": k.TERMINATION_TARGET, "status": "True", "reason": reason}
            target.update(message=message, lastTransitionTime=now_rfc3339())
            status["conditions"] = [c for c in conditions if c.get("type") != k.TERMINATION_TARGET]
            status["conditions"].append(target)
            try:
                self.client.store.replace("", "pods", *key(pod), pod, subresource="status")
            except ApiError as exc:
                if exc.code == 404:
                    continue
                raise
            if self.client.delete_pod(pod):
                self.client.event(pod, "Normal", "Stopped", message)

    def _remove_excess(self, excess: list[Obj]) -> None:
        """Pods beyond the group's count: finalized, deleted, event ExcessPodDeleted."""
        self.client.finalize(excess)
        for pod in excess:
            if not pods.deleting(pod) and self.client.delete_pod(pod):
                self.client.event(pod, "Normal", "ExcessPodDeleted", "Excess pod deleted")

    def _collect(self, wl: Obj) -> None:
        """No pod left: drop the Workload's finalizer and, as the garbage collector does once
        every owner pod is gone, delete it."""
        meta = wl["metadata"]
        owners = [r for r in meta.get("ownerReferences") or [] if r.get("kind") == "Pod"]
        deleting = bool(meta.get("deletionTimestamp"))
        alive = any(self.client.get("pods", meta["namespace"], r["name"]) for r in owners)
        if not deleting and (not owners or alive):
            return
        self.client.remove_finalizer(wl)
        if not deleting and self.client.workload(*key(wl)) is not None:
            self.client.store.delete(G, "workloads", *key(wl))

    def _recheck_after_grace(self, group: Key, members: list[Obj]) -> None:
        """A terminating pod stops counting as running once its grace period is over."""
        deadlines = [
            pods.parse_time(p["metadata"]["deletionTimestamp"]).timestamp()
            + int(p["metadata"].get("deletionGracePeriodSeconds") or 0)
            for p in members
            if pods.deleting(p)
        ]
        if not deadlines or group in self._timers:
            return
        self._timers.add(group)

        def recheck() -> None:
            self._timers.discard(group)
            self._touch(group)

        delay = max(0.0, max(deadlines) - _now().timestamp()) + 1.0
        asyncio.get_running_loop().call_later(delay, recheck)


def _annotation(obj: Obj, name: str) -> str | None:
    return pods.annotations_of(obj).get(name)


def _is_group_workload(wl: Obj) -> bool:
    return _annotation(wl, k.IS_GROUP_WORKLOAD_ANNOTATION) == "true"


def _conflict(label: str, old: str, new: str) -> str:
    return (
        "invalid admission check PodSetUpdate: conflict for nodeSelector: "
        f"conflict for key={label}, value1={old}, value2={new}"
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
