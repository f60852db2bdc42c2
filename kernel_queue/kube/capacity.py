"""What a LocalQueue's status says of its use, for `GET /api/kernel-queue/queues`.

Kueue's LocalQueue status counts the queue's pending and admitted Workloads and sums what the
admitted ones use per flavor; it names no Workload and no notebook, so nothing of other users'
kernels leaks through it. The ClusterQueue's quota (the capacity) is shared with other
namespaces and is not read here. One GET per call; the caller decides how often.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel_queue import quantities
from kernel_queue.kube import kueue_versions


@dataclass(frozen=True)
class Usage:
    """One LocalQueue as its status tells it: Workloads pending and admitted, GPUs in use."""

    pending: int
    admitted: int
    gpus: int


def usage(view: kueue_versions.LocalQueueView, gpu_resource: str) -> Usage:
    """The GPUs `view`'s admitted Workloads use, summed over flavors (`gpu_resource` is the
    resource name GPUs are asked under, e.g. `nvidia.com/gpu`)."""
    gpus = sum(
        int(quantities.parse(resources[gpu_resource]))
        for resources in view.usage.values()
        if gpu_resource in resources
    )
    return Usage(pending=view.pending, admitted=view.admitted, gpus=gpus)


async def read(backend: Any, queue: str, gpu_resource: str = "nvidia.com/gpu") -> Usage:
    """GET the LocalQueue `queue` in `backend`'s namespace (a `KubernetesBackend`: its API
    client and Kueue version discovery) and say its use. Raises what the API call raises
    (`ClusterApiError` and kin, `KueueNotInstalled`).

    The backend offers no public accessor for its client and discovery; these two private
    attributes are the whole dependence (see the module's report)."""
    api = await backend._client()
    versions = await backend._discovery.versions(api)
    obj: Mapping[str, Any] = await api.get(versions.local_queues, backend.namespace, queue)
    view = kueue_versions.local_queue(obj, versions.kueue)
    return usage(view, gpu_resource)
