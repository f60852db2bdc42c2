"""Parking a kernel's pod group through its Workload's `spec.active`, the one switch Kueue
honours for a plain pod group.

`false` (what `kubectl kueue stop workload` writes): Kueue's workload controller evicts the
Workload as `Deactivated`, drops it from its queue and from the quota it counts, and the pod
reconciler marks each running pod `TerminationTarget` (`WorkloadEvictedDueToDeactivated`) and
deletes it with the pod's own grace, so the launcher checkpoints on SIGTERM; the Workload stays
(`pkg/controller/core/workload_controller.go`, `pkg/controller/jobframework/reconciler.go`).
`true` again: `Requeued=True, Reactivated`, back in the queue at its creation time's place. The
field is the same at v1beta1 and v1beta2. The same merge patch sets (or removes) our
`kernel-queue.dev/parked` annotation, so a Workload someone else deactivated never reads as
parked. It is idempotent, so it is retried on 429, 5xx, timeouts and 409 within the backend's
retry budget; what still fails is the caller's sentence to say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel_queue import errors
from kernel_queue.kube import kueue
from kernel_queue.kube.client import explain, retries
from kernel_queue.kube.client.verbs import KubeApi, Resource

Obj = dict[str, Any]


class _Retry(errors.ClusterUnavailable):
    """A 409 on the patch, retried as the server's other passing refusals are."""

    def __init__(self, conflict: errors.ClusterConflict) -> None:
        super().__init__(conflict.status, conflict.reason, conflict.message)
        self.conflict = conflict


async def set_active(
    api: KubeApi,
    workloads: Resource,
    namespace: str,
    name: str,
    active: bool,
    policy: retries.Backoff,
) -> Obj:
    """Patch the Workload's `spec.active` (and `kueue.PARKED_ANNOTATION`, set with false and
    removed with true); return it as stored. Raises the last
    `ClusterApiError` once the retries are spent (`ClusterNotFound` if it is gone)."""
    marked = None if active else "true"  # ours: a Workload parked by anyone else is not
    body = {
        "metadata": {"annotations": {kueue.PARKED_ANNOTATION: marked}},
        "spec": {"active": active},
    }

    async def call() -> Obj:
        try:
            return await api.patch(workloads, namespace, name, body, patch_type="merge")
        except errors.ClusterConflict as exc:
            raise _Retry(exc) from exc

    try:
        return await retries.retry(call, policy)
    except _Retry as exc:
        raise exc.conflict from exc


async def switch(
    api: KubeApi,
    workloads: Resource,
    namespace: str,
    name: str,
    *,
    active: bool,
    policy: retries.Backoff,
    who: str,
    seen: Callable[[], Obj | None],
) -> None:
    """`set_active`, or the user's sentence: what failed and what the kernel does meanwhile.
    When the patch failed for good but `seen()` (the informer's copy) shows the Workload as
    wanted, a reply was lost after the write: that is success."""
    try:
        await set_active(api, workloads, namespace, name, active, policy)
    except errors.ClusterApiError as exc:
        current = seen()
        if current is not None and kueue.workload_active(current) is active:
            return
        doing, meanwhile = ("wake it", "it stays parked") if active else ("park it", "it runs on")
        doing += f" (patch spec.active of its Workload {name})"
        raise explain.failure(exc, who=who, doing=doing, after=f"; {meanwhile}") from exc
