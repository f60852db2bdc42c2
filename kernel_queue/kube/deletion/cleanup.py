"""Deleting a kernel's objects until each is gone or going: Workloads, pods, Services, Secret.

`delete_group` ends one pod group: its Workload first (Kueue then stops the pods and drops their
finalizers, and frees the quota), then each of the group's pods still there, read from the API
(a cache could miss one made a moment ago). `delete_kernel` ends every group of the kernel and
deletes its Services (the kernel's, and a multi-pod kernel's headless one) and Secret. A 404
counts as gone; transient errors are retried by the API; what still fails raises, and the
caller hands the rest to the reaper. Each returns what it
deleted ("pod kq-…-head-0"), for the reaper's log. Workloads are deleted at the version the
connection speaks (`workloads`, from `preflight.Discovery`; None where the cluster serves no
Kueue, so none exists). No state of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kernel_queue.kube import kueue, names
from kernel_queue.kube.client.verbs import KubeApi, Resource

Obj = dict[str, Any]
CONFIRM_ROUNDS = 3
"""Lists of a group's pods after deleting them, to catch a replacement made meanwhile."""


def kernel_selector(kernel_id: str) -> str:
    """The label selector of every object of the kernel."""
    return f"{kueue.KERNEL_ID_LABEL}={names.label_value(kernel_id)}"


def _deleting(pod: Obj) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _group_of(pod: Obj) -> str:
    return str(
        ((pod.get("metadata") or {}).get("labels") or {}).get(kueue.POD_GROUP_NAME_LABEL, "")
    )


async def delete_pods(
    api: KubeApi, namespace: str, selector: str, *, grace: int | None = None
) -> list[str]:
    """Delete every pod matching `selector` that is not already being deleted (with `grace` 0,
    those too: a kill must not wait for their grace); list again until none is left standing."""
    deleted: list[str] = []
    for _ in range(CONFIRM_ROUNDS):
        pods, _ = await api.list(kueue.PODS, namespace, label_selector=selector)
        standing = [p for p in pods if grace == 0 or not _deleting(p)]
        for pod in standing:
            name = pod["metadata"]["name"]
            if await api.delete(kueue.PODS, namespace, name, grace_seconds=grace):
                deleted.append(f"pod {name}")
        if not standing or grace == 0:
            break
    return deleted


async def delete_group(
    api: KubeApi,
    namespace: str,
    kernel_id: str,
    group: str,
    *,
    workloads: Resource | None,
    grace: int | None = None,
) -> list[str]:
    """End one pod group of the kernel: its Workload, then its pods."""
    deleted = []
    if workloads is not None and await api.delete(workloads, namespace, group):
        deleted.append(f"Workload {group}")
    selector = f"{kernel_selector(kernel_id)},{kueue.POD_GROUP_NAME_LABEL}={group}"
    return deleted + await delete_pods(api, namespace, selector, grace=grace)


async def delete_kernel(
    api: KubeApi,
    namespace: str,
    kernel_id: str,
    groups: Iterable[str] = (),
    *,
    workloads: Resource | None,
    service: str | None = None,
    secret: str | None = None,
    grouped: bool = True,
) -> list[str]:
    """Everything of the kernel: the Workloads of `groups` and of every group its pods name,
    the pods, and its Service and Secret (their names; None: the kernel's, "": none). With the
    kernel's Service (None) goes its group Service, unless `grouped` is False (a kernel known to
    run one pod has none: no request is spent on it)."""
    selector = kernel_selector(kernel_id)
    pods, _ = await api.list(kueue.PODS, namespace, label_selector=selector)
    deleted = []
    for group in sorted(set(groups) | {_group_of(p) for p in pods} - {""}):
        if workloads is not None and await api.delete(workloads, namespace, group):
            deleted.append(f"Workload {group}")
    deleted += await delete_pods(api, namespace, selector)
    services = [names.service_name(kernel_id)] if service is None else [service]
    if service is None and grouped:
        services.append(names.group_service_name(kernel_id))
    secret = names.secret_name(kernel_id) if secret is None else secret
    for name in filter(None, services):
        if await api.delete(kueue.SERVICES, namespace, name):
            deleted.append(f"Service {name}")
    if secret and await api.delete(kueue.SECRETS, namespace, secret):
        deleted.append(f"Secret {secret}")
    return deleted
