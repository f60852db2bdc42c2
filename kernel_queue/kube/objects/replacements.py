"""Replacement pods for an evicted group whose spec this server does not hold (adopted after a
restart): copies of the pods Kueue last saw, so the role hash and the Workload are kept; and
what the replaced head's checkpoint saved, carried on its replacement (pure).
"""

from __future__ import annotations

from typing import Any

from kernel_queue.kube import kueue

Obj = dict[str, Any]


def latest_round(pods: list[Obj]) -> list[Obj]:
    """The pods of the newest replacement round (one per role and index)."""
    newest: dict[str, Obj] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", "")):
        role = pod["metadata"]["name"].rsplit("-", 1)[0]
        newest[role] = pod
    return list(newest.values())


def replacement(old: Obj, attempt: int) -> Obj:
    """A new pod with `old`'s spec and labels (Kueue's role hash is unchanged), a new name, and
    none of what the API server, Kueue or the kubelet added."""
    meta = old["metadata"]
    added = (kueue.PODSET_LABEL, kueue.LOCAL_QUEUE_LABEL, kueue.CLUSTER_QUEUE_LABEL)
    labels = {
        k: v
        for k, v in (meta.get("labels") or {}).items()
        if k not in added and k != kueue.MANAGED_LABEL
    }
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != kueue.ROLE_HASH_ANNOTATION
    }
    spec = {k: v for k, v in old["spec"].items() if k not in ("nodeName", "schedulingGates")}
    base = meta["name"].rsplit("-", 1)[0]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{base}-{attempt}", "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def copies(pods: list[Obj], attempt: int) -> list[Obj]:
    """Replacements of the group's newest round of `pods`."""
    return [replacement(old, attempt) for old in latest_round(pods)]


def carrying(pods: list[Obj], saved: str) -> list[Obj]:
    """`pods` with the head's `kueue.SAVED_ANNOTATION` saying `saved` (none when "")."""
    for pod in pods:
        meta = pod["metadata"]
        if (meta.get("labels") or {}).get(kueue.ROLE_LABEL) != kueue.ROLE_HEAD:
            continue
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()}
        annotations.pop(kueue.SAVED_ANNOTATION, None)
        if saved:
            annotations[kueue.SAVED_ANNOTATION] = saved
        meta["annotations"] = annotations
    return pods
