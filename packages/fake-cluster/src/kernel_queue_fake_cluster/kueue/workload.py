"""The Workload as the fake Kueue writes it: built from a pod group, and its status transitions.

Pure functions on dicts after Kueue's `pkg/controller/jobframework` and `pkg/workload`:
podSets per role hash, priority, owner references; QuotaReserved, Admitted, Evicted, Preempted,
Requeued and Finished with Kueue's reasons and messages. Callers write the result to the store.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from kernel_queue_fake_cluster.apiserver.kinds import now_rfc3339
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import pods

Obj = dict[str, Any]


def new_workload(
    name: str,
    members: list[Obj],
    *,
    priority: int,
    priority_class: str | None,
    topology: bool,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """A group's Workload (or a single pod's): `NewGroupWorkload` / `ConstructWorkload`.
    `labels`: those the Configuration's `integrations.labelKeysToCopy` copies (`copied`)."""
    first = members[0]
    group = bool(pods.group_name(first))
    meta: Obj = {
        "name": name,
        "namespace": first["metadata"]["namespace"],
        "finalizers": [k.RESOURCE_IN_USE_FINALIZER],
        "ownerReferences": [owner_reference(pod, controller=not group) for pod in members],
    }
    if labels:
        meta["labels"] = dict(labels)
    if group:
        meta["annotations"] = {k.IS_GROUP_WORKLOAD_ANNOTATION: "true"}
        if gated_by := pods.annotations_of(first).get(k.ADMISSION_GATED_BY_ANNOTATION):
            meta["annotations"][k.ADMISSION_GATED_BY_ANNOTATION] = gated_by
    else:
        meta["labels"] = {**(labels or {}), k.JOB_UID_LABEL: first["metadata"]["uid"]}
    spec: Obj = {
        "active": True,
        "queueName": pods.labels_of(first).get(k.QUEUE_LABEL, ""),
        "podSets": pod_sets(members, topology=topology),
        "priority": priority,
    }
    if priority_class:
        spec["priorityClassRef"] = {
            "group": k.KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
    return {"apiVersion": f"{k.KUEUE_GROUP}/{k.KUEUE_VERSION}", "kind": "Workload",
            "metadata": meta, "spec": spec}  # fmt: skip


def copied(members: list[Obj], keys: Iterable[str]) -> dict[str, str]:
    """The labels of `keys` the members carry, for their Workload (`labelKeysToCopy`); a key
    whose value differs between members raises ValueError with Kueue's sentence (the Workload
    is then not created)."""
    found: dict[str, str] = {}
    for key in keys:
        values = {pods.labels_of(pod)[key] for pod in members if key in pods.labels_of(pod)}
        if len(values) > 1:
            raise ValueError(f"label {key!r} has different values in the pods of the group")
        if values:
            found[key] = values.pop()
    return found


def owner_reference(pod: Obj, *, controller: bool) -> Obj:
    meta = pod["metadata"]
    ref: Obj = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    if controller:
        ref.update(controller=True, blockOwnerDeletion=True)
    return ref


def pod_sets(members: list[Obj], *, topology: bool) -> list[Obj]:
    """One podSet per role hash of the runnable pods, sorted by name (`constructGroupPodSets`);
    fast admission: the first runnable pod's role with count = total count."""
    first = members[0]
    if not pods.group_name(first):
        return [_pod_set(first, k.DEFAULT_POD_SET_NAME, 1, topology)]
    runnable = [pod for pod in members if pods.runnable_or_succeeded(pod)]
    if pods.annotations_of(first).get(k.GROUP_FAST_ADMISSION_ANNOTATION) == "true":
        pod = runnable[0]
        return [_pod_set(pod, pods.role_hash(pod), pods.total_count(first), topology)]
    roles: dict[str, list[Obj]] = {}
    for pod in runnable:
        roles.setdefault(pods.role_hash(pod), []).append(pod)
    return [_pod_set(group[0], role, len(group), topology) for role, group in sorted(roles.items())]


def _pod_set(pod: Obj, name: str, count: int, topology: bool) -> Obj:
    found: Obj = {"name": name, "count": count, "template": {"spec": copy.deepcopy(pod["spec"])}}
    if topology:
        found["topologyRequest"] = {"podIndexLabel": k.POD_INDEX_LABEL}
    return found


# -- conditions --------------------------------------------------------------------------------


def condition(wl: Obj, kind: str) -> Obj | None:
    conditions = (wl.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def is_true(wl: Obj, kind: str) -> bool:
    found = condition(wl, kind)
    return found is not None and found.get("status") == "True"


def set_condition(wl: Obj, kind: str, status: bool, reason: str, message: str) -> None:
    """`meta.SetStatusCondition`: the transition time changes only with the status."""
    conditions = wl.setdefault("status", {}).setdefault("conditions", [])
    value = "True" if status else "False"
    new = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message[:32768],
        "observedGeneration": int(wl["metadata"].get("generation", 1)),
    }
    found = condition(wl, kind)
    if found is None:
        conditions.append({**new, "lastTransitionTime": now_rfc3339()})
    else:
        if found.get("status") != value:
            found["lastTransitionTime"] = now_rfc3339()
        found.update(new)


def _reset(wl: Obj, kind: str, reason: str) -> None:
    """`resetActiveCondition`: a True condition turns False with "Previously: <message>"."""
    found = condition(wl, kind)
    if found is not None and found.get("status") == "True":
        set_condition(wl, kind, False, reason, "Previously: " + found.get("message", ""))


def has_reservation(wl: Obj) -> bool:
    return is_true(wl, k.QUOTA_RESERVED)


def is_finished(wl: Obj) -> bool:
    return is_true(wl, k.FINISHED)


def is_active(wl: Obj) -> bool:
    return bool((wl.get("spec") or {}).get("active", True))


def is_evicted(wl: Obj) -> bool:
    return is_true(wl, k.EVICTED)


def is_admissible(wl: Obj) -> bool:
    """`IsAdmissible`: what may wait in a queue (and shows in the visibility API)."""
    gated = pods.annotations_of(wl).get(k.ADMISSION_GATED_BY_ANNOTATION)
    return not (
        gated
        or is_finished(wl)
        or not is_active(wl)
        or has_reservation(wl)
        or is_true(wl, k.WAITING_FOR_REPLACEMENT_PODS)
        or wl["metadata"].get("deletionTimestamp")
    )


def reserve(wl: Obj, admission: Obj) -> None:
    """`SetQuotaReservation` + `SyncAdmittedCondition` (no admission checks)."""
    wl.setdefault("status", {})["admission"] = admission
    cq = admission["clusterQueue"]
    set_condition(
        wl, k.QUOTA_RESERVED, True, k.QUOTA_RESERVED, f"Quota reserved in ClusterQueue {cq}"
    )
    for kind in (k.EVICTED, k.PREEMPTED):
        _reset(wl, kind, k.QUOTA_RESERVED)
    sync_admitted(wl)


def unreserve(wl: Obj, reason: str, message: str) -> None:
    """`UnsetQuotaReservationWithCondition`: QuotaReserved False, admission null, Admitted."""
    set_condition(wl, k.QUOTA_RESERVED, False, reason, message)
    wl["status"].pop("admission", None)
    sync_admitted(wl)


def sync_admitted(wl: Obj) -> None:
    """Admitted follows QuotaReserved; leaving it adds to accumulatedPastExecutionTimeSeconds."""
    reserved, admitted = has_reservation(wl), condition(wl, k.ADMITTED)
    if reserved == (admitted is not None and admitted.get("status") == "True"):
        return
    if reserved:
        set_condition(wl, k.ADMITTED, True, k.ADMITTED, k.ADMITTED_MESSAGE)
        return
    if admitted is not None:
        since = pods.parse_time(admitted["lastTransitionTime"])
        seconds = int((datetime.datetime.now(datetime.UTC) - since).total_seconds())
        status = wl["status"]
        status["accumulatedPastExecutionTimeSeconds"] = (
            int(status.get("accumulatedPastExecutionTimeSeconds", 0)) + seconds
        )
    set_condition(wl, k.ADMITTED, False, k.NO_RESERVATION, k.NO_RESERVATION_MESSAGE)


def evict(wl: Obj, reason: str, message: str) -> None:
    """`Evict`'s status part: Evicted True and `schedulingStats.evictions` counted."""
    set_condition(wl, k.EVICTED, True, reason, message)
    stats = wl["status"].setdefault("schedulingStats", {}).setdefault("evictions", [])
    found = next((e for e in stats if e["reason"] == reason and e["underlyingCause"] == ""), None)
    if found is None:
        stats.append({"reason": reason, "underlyingCause": "", "count": 1})
    else:
        found["count"] += 1


def pending_as_deactivated(wl: Obj) -> bool:
    """An inactive Workload without quota reads QuotaReserved False `Deactivated`, "The workload
    is deactivated" (0.20's granular reasons, `resolveGranularUnadmittedQuotaReservedCondition`;
    up to 0.19 it keeps the eviction's `Pending`). True when that changed it."""
    reserved = condition(wl, k.QUOTA_RESERVED)
    if is_active(wl) or reserved is None or reserved.get("status") != "False":
        return False
    if reserved.get("reason") == k.DEACTIVATED:
        return False
    unreserve(wl, k.DEACTIVATED, k.DEACTIVATED_MESSAGE)
    return True


def preempt(wl: Obj, reason: str, message: str) -> None:
    """Evicted=Preempted plus Preempted=<reason>, both with the preemption message."""
    set_condition(wl, k.PREEMPTED, True, reason, message)
    evict(wl, k.PREEMPTED, message)


def finish(wl: Obj, reason: str, message: str) -> None:
    set_condition(wl, k.FINISHED, True, reason, message)


def preemption_message(preemptor: Obj, cq_path: str) -> str:
    """`preemptionMessage` (`pkg/scheduler/preemption/preemption.go`) for a preemption within
    the ClusterQueue."""
    meta = preemptor["metadata"]
    job_uid = pods.labels_of(preemptor).get(k.JOB_UID_LABEL) or "UNKNOWN"
    return (
        f"Preempted to accommodate a workload (UID: {meta.get('uid', '')}, JobUID: {job_uid}) "
        f"due to prioritization in the ClusterQueue; preemptor path: {cq_path}; "
        f"preemptee path: {cq_path}"
    )
