"""How the fake Kueue reads a plain pod: group name and size, role hash, gates, phase predicates.

Pure functions over pod dicts, after Kueue's `pkg/controller/jobs/pod/pod_controller.go` and
`pkg/util/pod`: which Workload a pod belongs to, which pods count as runnable or active, and the
orders Kueue keeps and drops pods in when a group has too many.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from typing import Any

from kernel_queue_fake_cluster.kueue import constants as k

Obj = dict[str, Any]


def labels_of(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def group_name(pod: Obj) -> str:
    """The group (= Workload) name; the annotation wins over the label (`GetPodGroupName`)."""
    return annotations_of(pod).get(k.GROUP_NAME_ANNOTATION) or labels_of(pod).get(
        k.GROUP_NAME_LABEL, ""
    )


def total_count(pod: Obj) -> int:
    """`pod-group-total-count`; ValueError with Kueue's wording when it is not an int >= 1."""
    text = annotations_of(pod)[k.GROUP_TOTAL_COUNT_ANNOTATION]
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    count = int(text)
    if count < 1:
        raise ValueError(
            f"incorrect annotation value '{k.GROUP_TOTAL_COUNT_ANNOTATION}={text}': "
            "group total count should be greater than zero"
        )
    return count


def single_workload_name(pod_name: str, uid: str) -> str:
    """`pod-<name>-<5 hex>` (`GetWorkloadNameForOwnerWithGVK`: sha1 of kind, group, name, uid)."""
    digest = hashlib.sha1(f"Pod\n\n{pod_name}\n{uid}".encode()).hexdigest()
    return f"{f'pod-{pod_name}'[: 253 - 6]}-{digest[:5]}"


def workload_name(pod: Obj) -> str | None:
    """The Workload this pod belongs to, or None if Kueue does not manage it (or no uid yet)."""
    if labels_of(pod).get(k.MANAGED_LABEL) != k.MANAGED_LABEL_VALUE:
        return None
    meta = pod["metadata"]
    if group := group_name(pod):
        return group
    return single_workload_name(meta["name"], meta["uid"]) if meta.get("uid") else None


def role_hash(pod: Obj) -> str:
    """The pre-set annotation, else 8 hex of sha256 over Kueue's `SpecShape` as JSON."""
    if found := annotations_of(pod).get(k.ROLE_HASH_ANNOTATION):
        return found
    spec = pod.get("spec") or {}

    def containers(items: list[Obj] | None) -> list[Obj] | None:
        shapes = [
            {
                "ports": c.get("ports"),
                "resources": {"requests": _strings((c.get("resources") or {}).get("requests"))},
            }
            for c in items or []
        ]
        return shapes or None

    shape: Obj = {
        "initContainers": containers(spec.get("initContainers")),
        "containers": containers(spec.get("containers")),
        **{
            key: spec.get(key)
            for key in (
                "nodeSelector",
                "affinity",
                "tolerations",
                "runtimeClassName",
                "priority",
                "topologySpreadConstraints",
                "overhead",
                "resourceClaims",
            )
        },
    }
    if spec.get("resources") is not None:
        shape["resources"] = _strings(spec["resources"].get("requests"))
    text = json.dumps({"spec": shape}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _strings(requests: dict[str, Any] | None) -> dict[str, str] | None:
    """Quantities as Go marshals them; an absent map is null, an empty one {}."""
    return None if requests is None else {name: str(value) for name, value in requests.items()}


def gates(pod: Obj) -> list[str]:
    return [g.get("name", "") for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def is_gated(pod: Obj) -> bool:
    return k.ADMISSION_GATE in gates(pod)


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def is_terminated(pod: Obj) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def is_suspended(pod: Obj) -> bool:
    """`podSuspended`: terminated or still holding the admission gate."""
    return is_terminated(pod) or is_gated(pod)


def deleting(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def runnable_or_succeeded(pod: Obj) -> bool:
    """`isPodRunnableOrSucceeded`: not Failed, and not deleted before a node took it."""
    if deleting(pod) and not (pod.get("spec") or {}).get("nodeName"):
        return False
    return phase(pod) != "Failed"


def is_active(pod: Obj, now: datetime.datetime) -> bool:
    """`IsActive` for one pod: Running and not terminating past its grace period (Kueue
    releases an evicted group's quota only once none of its pods is active)."""
    if phase(pod) != "Running":
        return False
    meta = pod["metadata"]
    if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") is not None:
        deadline = parse_time(meta["deletionTimestamp"]) + datetime.timedelta(
            seconds=int(meta["deletionGracePeriodSeconds"])
        )
        return now <= deadline
    return True


def is_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def has_finalizer(pod: Obj) -> bool:
    return k.POD_FINALIZER in (pod["metadata"].get("finalizers") or [])


def keep_order_active(pod: Obj) -> tuple[bool, bool, str]:
    """`sortActivePods`: pods to keep first (finalizer, ungated, older); excess ones are last."""
    meta = pod["metadata"]
    return (not has_finalizer(pod), is_gated(pod), meta.get("creationTimestamp", ""))


def keep_order_inactive(pod: Obj) -> tuple[bool, float, float]:
    """`sortInactivePods`: finalizer first, then the most recently active; replaced ones last."""
    meta = pod["metadata"]
    last = _epoch(meta.get("deletionTimestamp")) if deleting(pod) else float("inf")
    return (not has_finalizer(pod), -last, -_epoch(meta.get("creationTimestamp")))


def _epoch(text: str | None) -> float:
    return parse_time(text).timestamp() if text else 0.0


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
