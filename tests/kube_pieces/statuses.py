"""Literal Workloads, pods and conditions as the API server returns them, for the tables of
how a pod group's objects read (its status, whether it needs replacements, what it saved)."""

from __future__ import annotations

from typing import Any

ADMISSION = "kueue.x-k8s.io/admission"


def cond(kind: str, status: bool = True, reason: str = "", message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }


def workload(*conditions: dict[str, Any], flavors: tuple[str, ...] = ()) -> dict[str, Any]:
    wl: dict[str, Any] = {"metadata": {"name": "kq-1"}, "status": {"conditions": list(conditions)}}
    if flavors:
        wl["status"]["admission"] = {
            "podSetAssignments": [{"flavors": {"nvidia.com/gpu": f}} for f in flavors]
        }
    return wl


def pod(
    phase: str = "Pending",
    *,
    gated: bool = False,
    ready: bool = False,
    waiting: tuple[str, str] | None = None,
    exit_code: int | None = None,
    deleting: bool = False,
    created: str = "2026-11-30T00:00:00Z",
    ip: str = "127.10.0.5",
    said: str = "",
    uid: str = "uid-1",
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}}
    if waiting:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "message": said}}
    meta: dict[str, Any] = {
        "name": "kq-1-head-0",
        "uid": uid,
        "creationTimestamp": created,
        "labels": {"kernel-queue.dev/role": "head"},
    }
    if deleting:
        meta["deletionTimestamp"] = created
    return {
        "metadata": meta,
        "spec": {
            "schedulingGates": [{"name": ADMISSION}] if gated else [],
            "containers": [
                {"name": "kernel", "ports": [{"name": "shell", "containerPort": 50100}]}
            ],
        },
        "status": {
            "phase": phase,
            "podIP": ip,
            "conditions": [cond("Ready", ready)],
            "containerStatuses": [{"name": "kernel", "state": state}],
        },
    }
