"""What must exist before a kernel's objects are created: Kueue, the LocalQueue, the priority
class and the checkpoint claim. Each missing one is an error naming the fix; nothing is created.

Which versions of Kueue's APIs to speak is read once per connection from API discovery
(`Discovery`, one ``GET /apis``, retried as reads are) and handed to every user of Kueue's
kinds: this check, the informers, the position readers, the clean-up and the reaper.
"""

from __future__ import annotations

import asyncio
import logging

from kernel_queue import errors
from kernel_queue.kube import kueue
from kernel_queue.kube.client import retries, verbs
from kernel_queue.kube.client.verbs import KubeApi, Resource
from kernel_queue.kube.queueing import kueue_versions
from kernel_queue.kube.queueing.kueue_versions import KueueVersions
from kernel_queue.model import GroupSpec, short_id

log = logging.getLogger(__name__)

DISCOVERY_PATH = "/apis"
"""The APIGroupList: every API group the server serves (aggregated ones such as Kueue's
visibility API included) and its versions, in one request any authenticated user may make."""


class Discovery:
    """The Kueue versions of one connection: read from API discovery on first use, then kept.

    Concurrent first callers share one read. A cluster serving no Kueue kernel-queue speaks is
    asked again on the next call (Kueue may be installed meanwhile); `reads` counts the reads."""

    def __init__(self, policy: retries.Backoff | None = None) -> None:
        self._policy = policy or retries.Backoff()  # as reads retry: 30 s of pauses
        self._found: KueueVersions | None = None
        self._lock = asyncio.Lock()
        self.reads = 0

    async def versions(self, api: KubeApi) -> KueueVersions:
        """v1beta2 where served, else v1beta1, for Kueue's objects and its visibility API each.
        `KueueNotInstalled` (its sentence names no kernel) when neither version of
        ``kueue.x-k8s.io`` is served; a `ClusterApiError` when discovery keeps failing."""
        if self._found is not None:
            return self._found
        async with self._lock:
            if self._found is None:
                self.reads += 1
                document = await retries.retry(lambda: api.get_path(DISCOVERY_PATH), self._policy)
                groups = kueue_versions.served(document)
                found = kueue_versions.choose(groups)
                if found is None:
                    raise errors.KueueNotInstalled(kueue_versions.not_served(groups))
                log.debug(
                    "speaking Kueue's API at %s (API discovery lists %s)",
                    found,
                    kueue_versions.shown(groups),
                )
                self._found = found
            return self._found

    async def workloads(self, api: KubeApi) -> Resource | None:
        """The Workload kind, or None when the cluster serves no Kueue (so no Workload of ours
        can exist): what the clean-up deletes."""
        try:
            return (await self.versions(api)).workloads
        except errors.KueueNotInstalled:
            return None


def claim(spec: GroupSpec) -> str | None:
    """The checkpoint claim the kernel's head pod mounts, if checkpoints are on."""
    return spec.checkpoint.claim if spec.checkpoint.enabled else None


async def check(
    api: KubeApi, spec: GroupSpec, namespace: str, discovery: Discovery
) -> KueueVersions:
    """Kueue installed, the LocalQueue there, the priority class and the checkpoint claim
    known: else say which. Returns the Kueue versions the cluster serves. API errors other than
    404 are raised as they are."""
    who = f"kernel {short_id(spec.kernel_id)}"
    try:
        served = await discovery.versions(api)
    except errors.KueueNotInstalled as exc:
        raise errors.KueueNotInstalled(f"{who}: {exc}") from exc
    try:
        await api.get(served.local_queues, namespace, spec.queue)
    except errors.ClusterNotFound as exc:
        # A missing LocalQueue is named in the Status; a path not served names nothing.
        if not (isinstance(exc, verbs.NotFound) and exc.details.get("name")):
            raise errors.KueueNotInstalled(
                f"{who}: the cluster serves no Kueue API ({exc.message}); install Kueue "
                "(its CRDs and controller) or use backend 'local'"
            ) from exc
        known, _ = await api.list(served.local_queues, namespace)
        listed = ", ".join(sorted(q["metadata"]["name"] for q in known)) or "none"
        raise errors.QueueNotFound(
            f"{who}: LocalQueue {spec.queue!r} does not exist in namespace {namespace!r}; "
            f"LocalQueues there: {listed}. Set `queue` in the kernelspec to one of them, or "
            "create it (see etc/kubernetes/queues.yaml)."
        ) from exc
    if spec.priority_class:
        try:
            await api.get(served.workload_priority_classes, None, spec.priority_class)
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
    return served
