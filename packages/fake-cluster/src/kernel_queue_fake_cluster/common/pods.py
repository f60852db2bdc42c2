"""What a pod's spec and status say, read the same way by the API server, the node agent and
the Endpoints controller: scheduling gates, condition dicts, readiness and Service target ports.

Pure functions over plain dicts; no store, no HTTP.
"""

from __future__ import annotations

from typing import Any

from kernel_queue_fake_cluster.common.objects import Obj


def gates(pod: Obj) -> list[str]:
    """Names of the pod's scheduling gates."""
    return [g.get("name", "") for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def condition(kind: str, status: bool, now: str, reason: str = "", message: str = "") -> Obj:
    """One pod condition dict (`lastProbeTime` null, as the kubelet leaves it)."""
    found: Obj = {"type": kind, "status": "True" if status else "False", "lastProbeTime": None}
    found["lastTransitionTime"] = now
    if reason:
        found["reason"] = reason
    if message:
        found["message"] = message
    return found


def scheduling_gated(now: str) -> Obj:
    """The PodScheduled condition of a gated pod, as kube-scheduler writes it."""
    return condition(
        "PodScheduled",
        False,
        now,
        "SchedulingGated",
        "Scheduling is blocked due to non-empty scheduling gates",
    )


def find_condition(pod: Obj | None, kind: str) -> Obj | None:
    """The pod's condition of type `kind`, or None."""
    found = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in found if c.get("type") == kind), None)


def terminal(pod: Obj) -> bool:
    """Phase Succeeded or Failed: its containers will not run again."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_ready(pod: Obj) -> bool:
    """Ready condition True, an IP, running and not being deleted: a serving endpoint."""
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    deleting = pod["metadata"].get("deletionTimestamp")
    return ready and bool(status.get("podIP")) and status.get("phase") == "Running" and not deleting


def target_port(port: Obj, pod: Obj) -> int | None:
    """The pod port a Service port forwards to (`targetPort` number or container port name)."""
    target: Any = port.get("targetPort", port.get("port"))
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for found in container.get("ports") or []:
            if found.get("name") == target:
                return int(found["containerPort"])
    return None
