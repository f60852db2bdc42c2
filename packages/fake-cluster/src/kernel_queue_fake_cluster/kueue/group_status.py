"""What a pod group's pods say about its Workload: whether the group is finished, and the
Workload's PodsReady and WaitingForReplacementPods conditions.

Pure functions over a Workload dict and its member pods, after Kueue's pod integration
(`Finished` in `pkg/controller/jobs/pod/pod_controller.go`) and the job reconciler
(`pkg/controller/jobframework/reconciler.go`); the group reconciler (`groups.py`) calls them
and writes the Workload.
"""

from __future__ import annotations

from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import pods
from kernel_queue_fake_cluster.kueue import workload as kw


def set_waiting_for_replacement(wl: Obj, absent: int) -> None:
    """WaitingForReplacementPods, which only pod groups have: True with the eviction's reason
    and message (else PodsFailed) while `absent` pods are missing, False PodsReady once they
    are back. While it is True, Kueue neither queues the Workload nor lists it as pending."""
    found = kw.condition(wl, k.WAITING_FOR_REPLACEMENT_PODS)
    evicted = kw.condition(wl, k.EVICTED) or {}
    if absent > 0 and evicted.get("status") == "True":
        reason, message = evicted["reason"], evicted["message"]
        kw.set_condition(wl, k.WAITING_FOR_REPLACEMENT_PODS, True, reason, message)
    elif absent > 0 and (found is None or found["status"] != "True"):
        message = k.PODS_FAILED_MESSAGE
        kw.set_condition(wl, k.WAITING_FOR_REPLACEMENT_PODS, True, k.PODS_FAILED, message)
    elif absent == 0 and found is not None and found["status"] != "False":
        message = k.NO_REPLACEMENT_MESSAGE
        kw.set_condition(wl, k.WAITING_FOR_REPLACEMENT_PODS, False, k.PODS_READY, message)


def finished(members: list[Obj]) -> tuple[str, str] | None:
    """`Finished()`: a group when all pods succeeded, or when a pod carries
    `retriable-in-group: "false"` and none is left running, always as `Succeeded` ("Pods
    succeeded: x/N.", even with failed pods); a single pod once it terminated. A pod deleted
    gracefully ends Succeeded when every container exits 0 (Kubernetes 1.27 and later), so a
    group whose pods exit 0 on SIGTERM finishes instead of being requeued."""
    first = members[0]
    if not pods.group_name(first):
        if not pods.is_terminated(first):
            return None
        reason = k.SUCCEEDED if pods.phase(first) == "Succeeded" else k.FAILED
        return reason, str((first.get("status") or {}).get("message", ""))
    if pods.annotations_of(first).get(k.GROUP_SERVING_ANNOTATION) == "true":
        return None
    total = pods.total_count(first)
    succeeded = sum(1 for p in members if pods.phase(p) == "Succeeded")
    unretriable = any(
        pods.annotations_of(p).get(k.RETRIABLE_IN_GROUP_ANNOTATION) == "false" for p in members
    )
    if succeeded == total or (unretriable and all(pods.is_terminated(p) for p in members)):
        return k.SUCCEEDED, f"Pods succeeded: {succeeded}/{total}."
    return None


def set_pods_ready(wl: Obj, members: list[Obj]) -> None:
    """waitForPodsReady's PodsReady condition: WaitForStart until every pod is ready, Started
    then, WaitForRecovery after a pod failed, Recovered (its timeouts are not modelled)."""
    current = kw.condition(wl, k.PODS_READY) or {}
    first = members[0]
    total = pods.total_count(first) if pods.group_name(first) else 1
    if not kw.is_true(wl, k.ADMITTED):
        ready = (False, k.WAIT_FOR_START, k.NOT_READY_MESSAGE)
    elif len(members) >= total and all(pods.is_ready(p) for p in members):
        recovering = current.get("reason") in (k.WAIT_FOR_RECOVERY, k.RECOVERED)
        ready = (True, k.RECOVERED if recovering else k.STARTED, k.READY_MESSAGE)
    elif current.get("status") == "True" or current.get("reason") == k.WAIT_FOR_RECOVERY:
        ready = (False, k.WAIT_FOR_RECOVERY, k.RECOVERY_MESSAGE)
    else:
        ready = (False, k.WAIT_FOR_START, k.NOT_READY_MESSAGE)
    kw.set_condition(wl, k.PODS_READY, *ready)
