"""What must exist before a kernel's objects are created: Kueue, the LocalQueue, the priority
class and the checkpoint claim. Each missing one is an error naming the fix; nothing is created.
"""

from __future__ import annotations

from kernel_queue import errors
from kernel_queue.kube import kueue, verbs
from kernel_queue.kube.verbs import KubeApi
from kernel_queue.model import GroupSpec, short_id


def claim(spec: GroupSpec) -> str | None:
    """The checkpoint claim the kernel's head pod mounts, if checkpoints are on."""
    return spec.checkpoint.claim if spec.checkpoint.enabled else None


async def check(api: KubeApi, spec: GroupSpec, namespace: str) -> None:
    """Kueue installed, the LocalQueue there, the priority class and the checkpoint claim
    known: else say which. API errors other than 404 are raised as they are."""
    who = f"kernel {short_id(spec.kernel_id)}"
    try:
        await api.get(kueue.LOCAL_QUEUES, namespace, spec.queue)
    except errors.ClusterNotFound as exc:
        # A missing LocalQueue is named in the Status; a path not served names nothing.
        if not (isinstance(exc, verbs.NotFound) and exc.details.get("name")):
            raise errors.KueueNotInstalled(
                f"{who}: the cluster serves no Kueue API ({exc.message}); install Kueue "
                "(its CRDs and controller) or use backend 'local'"
            ) from exc
        known, _ = await api.list(kueue.LOCAL_QUEUES, namespace)
        listed = ", ".join(sorted(q["metadata"]["name"] for q in known)) or "none"
        raise errors.QueueNotFound(
            f"{who}: LocalQueue {spec.queue!r} does not exist in namespace {namespace!r}; "
            f"LocalQueues there: {listed}. Set `queue` in the kernelspec to one of them, or "
            "create it (see etc/kubernetes/queues.yaml)."
        ) from exc
    if spec.priority_class:
        try:
            await api.get(kueue.WORKLOAD_PRIORITY_CLASSES, None, spec.priority_class)
        except errors.ClusterNotFound as exc:
            raise errors.PriorityClassNotFound(
                f"{who}: WorkloadPriorityClass {spec.priority_class!r} does not exist, so "
                "Kueue would never queue the kernel; fix `priority_class` in the "
                "kernelspec or create the class."
            ) from exc
    name = claim(spec)
    if name:
        try:
            await api.get(kueue.CLAIMS, namespace, name)
        except errors.ClusterNotFound as exc:
            raise errors.ConfigError(
                f"{who}: checkpoint claim {name!r} does not exist in namespace "
                f"{namespace!r}, so the kernel's pod could never start; create the "
                "PersistentVolumeClaim (ReadWriteMany, so a requeued kernel can mount it on "
                "any node) or fix `checkpoint.claim` in the kernelspec."
            ) from exc
