"""What a LocalQueue's status says of its use, for `GET /api/kernel-queue/queues`.

Kueue's LocalQueue status counts the queue's pending and admitted Workloads and sums what the
admitted ones use per flavor; it names no Workload and no notebook, so nothing of other users'
kernels leaks through it. The ClusterQueue's quota (the capacity) is shared with other
namespaces and is not read here. `usage` translates a LocalQueue (as `kueue_versions` reads it
at either version) into `Usage`; `read` makes the one GET, and turns every way it can fail into
an error whose sentence names the queue, its namespace and what to do. The caller decides how
often to read (`KubernetesBackend.local_queue_usage` is the public way in).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel_queue import errors, quantities
from kernel_queue.kube.client import explain, verbs
from kernel_queue.kube.client.verbs import KubeApi
from kernel_queue.kube.objects.preflight import Discovery
from kernel_queue.kube.queueing import kueue_versions

GPU_RESOURCE = "nvidia.com/gpu"
"""The resource GPUs are asked under."""
READ_WITHIN = 10.0
"""Seconds one read may take, its retries included: the queue listing waits no longer."""


@dataclass(frozen=True)
class Usage:
    """One LocalQueue as its status tells it: Workloads pending and admitted, GPUs in use."""

    pending: int
    admitted: int
    gpus: int


def usage(view: kueue_versions.LocalQueueView, gpu_resource: str = GPU_RESOURCE) -> Usage:
    """The GPUs `view`'s admitted Workloads use, summed over flavors (`gpu_resource` is the
    resource name GPUs are asked under). `ValueError` for a quantity that is no quantity."""
    gpus = sum(
        int(quantities.parse(resources[gpu_resource]))
        for resources in view.usage.values()
        if gpu_resource in resources
    )
    return Usage(pending=view.pending, admitted=view.admitted, gpus=gpus)


async def read(
    api: KubeApi,
    discovery: Discovery,
    namespace: str,
    queue: str,
    gpu_resource: str = GPU_RESOURCE,
    within: float = READ_WITHIN,
) -> Usage:
    """GET the LocalQueue `queue` in `namespace` (at the Kueue version `discovery` finds) and
    say its use, within `within` seconds. Raises, each with a sentence naming the queue and the
    namespace: `QueueNotFound` (no such LocalQueue), `KueueNotInstalled`, `ClusterApiError` and
    kin (as `explain.failure` words them: RBAC, a server that kept failing or did not answer in
    time), `KernelQueueError` (a status with a quantity Kueue never writes)."""
    who = f"LocalQueue {queue!r} in namespace {namespace!r}"
    try:
        try:
            async with asyncio.timeout(within):
                versions = await discovery.versions(api)
                obj: Mapping[str, Any] = await api.get(versions.local_queues, namespace, queue)
        except TimeoutError as exc:
            late = f"read LocalQueue {queue!r}: no answer within {within:g} s"
            raise errors.ClusterUnavailable(0, "Timeout", late) from exc
    except errors.KueueNotInstalled as exc:
        raise errors.KueueNotInstalled(f"{who}: {exc}") from exc
    except errors.ClusterNotFound as exc:
        if isinstance(exc, verbs.NotFound) and exc.details.get("name"):
            raise errors.QueueNotFound(missing(queue, namespace)) from exc
        raise errors.KueueNotInstalled(  # the path itself is not served
            f"{who}: the cluster serves no Kueue API ({exc.message}); install Kueue (its CRDs "
            "and controller) or use backend 'local'"
        ) from exc
    except errors.ClusterApiError as exc:
        raise explain.failure(exc, who=who, doing="read its status") from exc
    try:
        return usage(kueue_versions.local_queue(obj, versions.kueue), gpu_resource)
    except ValueError as exc:
        raise errors.KernelQueueError(
            f"{who}: its status has no usable {gpu_resource}: {exc}"
        ) from exc


def missing(queue: str, namespace: str) -> str:
    """The sentence of a LocalQueue deleted since its kernels were queued."""
    return (
        f"LocalQueue {queue!r} does not exist in namespace {namespace!r} (any more): Kueue "
        "admits none of its kernels until it is created again; ask the cluster's admin to "
        "create it (see etc/kubernetes/queues.yaml)"
    )
