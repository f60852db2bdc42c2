"""Where a kernel's pod group stands, derived from its Workload and pods (pure).

`group_status` turns what the informers hold into the backend-neutral `GroupStatus` the
lifecycle reads; `needs_replacement` says when Kueue waits for replacement pods after an
eviction (Kueue never recreates evicted pods itself: the owner must, with the same group name,
count and role hash; Kueue's plain-pods KEP, "Retrying Failed Pods"). A Workload this server
parked (`spec.active: false`, `kueue.PARKED_ANNOTATION`) is never preempted: PARKING while Kueue
still counts its quota or a pod of it still stops, PARKED after. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernel_queue.kube import kueue, names
from kernel_queue.kube.queueing import launch_failures
from kernel_queue.model import GroupPhase, GroupStatus, QueuePlace

Obj = Mapping[str, Any]
TERMINAL_PHASES = ("Succeeded", "Failed")
PARKING_MESSAGE = "saving its variables, then giving its admission back"
"""While a parked group's pods stop (they save within their grace) and Kueue still counts it."""


def stopping_pods(pods: Sequence[Obj]) -> list[Obj]:
    """Pods of an evicted or parked group that have not ended: not terminal and not gated (gated
    pods are replacements, already queued). A pod being deleted counts: its kernel still saves
    within its grace, and its delete may reach the server before the Workload's eviction (two
    watch streams), so leaving it out would read a preemption as a plain requeue."""
    return [
        pod
        for pod in pods
        if (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES and not kueue.is_gated(pod)
    ]


def head(pods: Sequence[Obj]) -> Obj | None:
    """The newest head pod (replacement rounds are newer), or None."""
    heads = [
        pod
        for pod in pods
        if ((pod.get("metadata") or {}).get("labels") or {}).get(kueue.ROLE_LABEL)
        == kueue.ROLE_HEAD
    ]
    return max(heads, key=_created, default=None)


def _created(pod: Obj) -> tuple[str, int]:
    """When a pod was made, in whole seconds, then its replacement round (within one second).
    Not its resourceVersion: that is its last write's, and a pod that ended after its
    replacement was made carries the higher one."""
    meta = pod.get("metadata") or {}
    return (str(meta.get("creationTimestamp", "")), names.pod_attempt(str(meta.get("name", ""))))


def needs_replacement(workload: Obj | None, pods: Sequence[Obj]) -> bool:
    """True once an evicted group's pods have stopped and Kueue waits for replacements (not
    after a pod failed with no eviction).

    Stopped means ended or gone, not only being deleted: a pod that still saves counts, or a
    replacement made meanwhile is an excess pod Kueue deletes, and the next is made at once
    (`Requeued` of an earlier wake stays True through a later park's eviction)."""
    if workload is None or kueue.workload_finished(workload):
        return False
    # Kueue also waits for replacements of a pod that failed by itself (reason PodsFailed): a
    # crash, which fails the kernel; a new pod would only crash again.
    waiting = kueue.is_true(workload, kueue.WAITING_FOR_REPLACEMENT_PODS) and (
        (kueue.condition(workload, kueue.WAITING_FOR_REPLACEMENT_PODS) or {}).get("reason")
        != kueue.REASON_PODS_FAILED
    )
    requeued = kueue.is_true(workload, kueue.REQUEUED) and kueue.workload_evicted(workload)
    running = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES]
    return (waiting or bool(requeued)) and not running


def saved_message(workload: Obj | None, pods: Sequence[Obj]) -> str:
    """After a preemption or a park: what the stopped kernel's checkpoint saved, as its launcher
    said in the head pod's termination message, or as its gated replacement carries it once
    that pod is gone (`kueue.SAVED_ANNOTATION`); "" while neither says anything."""
    if workload is None or kueue.workload_evicted(workload) is None:
        return ""
    ended = [p for p in pods if (p.get("status") or {}).get("phase") in TERMINAL_PHASES]
    last = head(ended)
    said = kueue.termination_message(last, "kernel") if last else ""
    waiting = head([p for p in pods if kueue.is_gated(p)])  # a replacement carries it on
    if said or waiting is None:
        return said
    return str(kueue.dig(waiting, "metadata", "annotations", kueue.SAVED_ANNOTATION) or "")


def group_status(
    workload: Obj | None,
    pods: Sequence[Obj],
    *,
    place: QueuePlace | None = None,
    was_running: bool = False,
    had_workload: bool = False,
    pod_ip_address: bool = False,
    saved: str = "",
    listening: str = "",
) -> GroupStatus:
    """The group's status. `was_running`: its head has run before (a later failure is the
    kernel ending, not a failed start). `had_workload`: Kueue made its Workload before, so its
    absence now means someone deleted it. `pod_ip_address`: report the head pod's IP. `saved`:
    the last `saved_message` the caller saw (kept after the pod is gone), shown while a preempted
    group waits. `listening`: the uid of a head pod whose kernel the caller reached on its shell
    port (`kernel_endpoint`): that pod runs before it is Ready, which a kubelet's readiness probe
    says up to one periodSeconds after the kernel listens."""
    lead = head(pods)
    if workload is None:
        if had_workload or (not pods and was_running):
            return GroupStatus(
                GroupPhase.FINISHED, message="the kernel's Workload was deleted", exit_code=0
            )
        return GroupStatus(GroupPhase.PENDING, message="waiting for Kueue to create the Workload")
    finished = kueue.workload_finished(workload)
    if finished is not None:
        code = kueue.container_exit_code(lead, "kernel") if lead else None
        if code is None:
            code = 0 if finished[0] == kueue.REASON_SUCCEEDED else 1
        return GroupStatus(GroupPhase.FINISHED, message=finished[1], exit_code=code)
    evicted = kueue.workload_evicted(workload)
    stopping = stopping_pods(pods)
    if kueue.parked(workload):  # parked: an eviction, but not a preemption
        if kueue.holds_quota(workload) or stopping:
            return GroupStatus(GroupPhase.PARKING, message=PARKING_MESSAGE)
        return GroupStatus(GroupPhase.PARKED, message=saved if evicted is not None else "")
    if evicted is not None and stopping:
        return GroupStatus(GroupPhase.EVICTED, message=evicted[1] or evicted[0])
    if not kueue.workload_admitted(workload):
        saved = saved if evicted is not None else ""
        return GroupStatus(GroupPhase.QUEUED, place=place, message=saved)
    flavor = ", ".join(kueue.flavors(workload)) or None
    admitted = GroupStatus(GroupPhase.ADMITTED, flavor=flavor)
    if lead is None or kueue.is_gated(lead):
        return admitted
    phase = (lead.get("status") or {}).get("phase")
    if phase in TERMINAL_PHASES:
        if kueue.stopped_by_kueue(lead):  # an eviction's stop: its replacement is not listed
            return admitted  # yet (the Workload is admitted again), not the kernel's end
        code = kueue.container_exit_code(lead, "kernel")
        if was_running:
            ended = "the kernel ended" + ("" if code is None else f" with exit code {code}")
            return GroupStatus(GroupPhase.FINISHED, message=ended, exit_code=code)
        return GroupStatus(GroupPhase.FAILED, message=launch_failures.ended(lead), exit_code=code)
    waiting = kueue.waiting_reason(lead)
    if waiting is not None:
        said = f"{waiting[0]}: {waiting[1]}".rstrip(": ")
        return admitted.evolve(message=_with_claims(lead, said))
    if kueue.pod_ready(lead) or (listening and listening == _uid(lead)):
        address = (lead.get("status") or {}).get("podIP", "") if pod_ip_address else ""
        return GroupStatus(
            GroupPhase.RUNNING, flavor=flavor, kernel_alive=True, address=str(address or "")
        )
    return admitted


def kernel_endpoint(pod: Obj) -> tuple[str, int] | None:
    """Where the head pod's kernel answers, once its kernel container runs and the pod is not
    Ready yet: the pod's IP and the container's `shell` port, the readiness probe's target.
    None before that, once Ready, and for a pod ending or being deleted."""
    status = pod.get("status") or {}
    ip = status.get("podIP")
    meta = pod.get("metadata") or {}
    if not ip or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
        return None
    if kueue.pod_ready(pod) or not _kernel_runs(status):
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == "kernel":
            for port in container.get("ports") or []:
                if port.get("name") == "shell" and isinstance(port.get("containerPort"), int):
                    return str(ip), int(port["containerPort"])
    return None


def _kernel_runs(status: Obj) -> bool:
    return any(
        c.get("name") == "kernel" and (c.get("state") or {}).get("running") is not None
        for c in status.get("containerStatuses") or []
    )


def _uid(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


UNBOUND_CLAIMS = "pod has unbound immediate PersistentVolumeClaims"
"""The scheduler's words for a pod whose claims have no volume bound."""


def _with_claims(pod: Obj, said: str) -> str:
    """`said`, and for a pod the scheduler holds on unbound claims, which claims and the fix
    (the scheduler names none)."""
    if UNBOUND_CLAIMS not in said:
        return said
    volumes = (pod.get("spec") or {}).get("volumes") or []
    claims = [
        v["persistentVolumeClaim"].get("claimName")
        for v in volumes
        if v.get("persistentVolumeClaim")
    ]
    named = " or ".join(repr(str(c)) for c in claims) or "(none named)"
    return (
        f"{said} Its PersistentVolumeClaim {named} is not bound to a volume: the cluster's "
        "storage has none to give it (a claim asking for ReadWriteMany needs a StorageClass that "
        "provides ReadWriteMany, such as NFS, CephFS, EFS or Filestore); ask the cluster's admin "
        "to bind it, or set `checkpoint.claim` to a claim that is bound"
    )
