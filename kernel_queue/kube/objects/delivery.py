"""Delivering the launcher archive: one content-addressed ConfigMap per namespace, made once.

`LauncherDelivery.ensure` is awaited before a kernel's pods are created: the first call of the
process builds the archive in a thread (`launcher_archive.current`), and the first call per
namespace creates its ConfigMap, where a 409 is fine once a read shows it holds these very
bytes (another server of the same version made it); later calls cost nothing, so 2,000 kernels
write one copy, not 2,000. A ConfigMap of that name holding other bytes is refused with a
sentence: kernels would run code the server did not send.
"""

from __future__ import annotations

import asyncio

from kernel_queue import errors
from kernel_queue.kube import kueue
from kernel_queue.kube.client.verbs import KubeApi
from kernel_queue.kube.objects import launcher_archive

MOUNT_GRACE = 2.0
"""Seconds a kernel's pod may stay ContainerCreating before the backend reads whether the
launcher ConfigMap it mounts still exists (a kubelet shows a missing one only in events): a
pod that starts sooner costs no read of the 140 kB object."""


async def gone(api: KubeApi, namespace: str, name: str) -> bool:
    """True when the launcher ConfigMap `name` no longer exists in `namespace`."""
    try:
        await api.get(kueue.CONFIGMAPS, namespace, name)
    except errors.ClusterNotFound:
        return True
    return False


class LauncherDelivery:
    """The namespaces whose launcher ConfigMap this process has made sure of."""

    def __init__(self) -> None:
        self._ready: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._archive: launcher_archive.Archive | None = None
        self._building = asyncio.Lock()  # kernels submitted together wait for one build

    @property
    def name(self) -> str | None:
        """The ConfigMap name of this process's archive, once built (None before)."""
        return self._archive.name if self._archive is not None else None

    async def archive(self) -> launcher_archive.Archive:
        """This process's archive, built off the event loop the first time."""
        if self._archive is None:
            async with self._building:
                if self._archive is None:
                    self._archive = await asyncio.to_thread(launcher_archive.current)
        return self._archive

    async def ensure(self, api: KubeApi, namespace: str, who: str = "a kernel") -> str:
        """Make sure `namespace` holds the archive's ConfigMap; return its name. `who` (``kernel
        1a2b3c4d``) begins the sentence of a refused ConfigMap."""
        found = await self.archive()
        if namespace in self._ready:
            return found.name
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            if namespace not in self._ready:
                await _create(api, namespace, found, who)
                self._ready.add(namespace)
        return found.name

    def forget(self, namespace: str) -> None:
        """Make the next `ensure` in `namespace` check again (its ConfigMap went missing)."""
        self._ready.discard(namespace)


async def _create(api: KubeApi, namespace: str, found: launcher_archive.Archive, who: str) -> None:
    body = launcher_archive.configmap(found, namespace)
    try:
        await api.create(kueue.CONFIGMAPS, namespace, body)
        return
    except errors.ClusterConflict:
        pass
    existing = await api.get(kueue.CONFIGMAPS, namespace, found.name)
    if not launcher_archive.holds(existing, found):
        raise errors.LaunchFailed(
            f"{who}: ConfigMap {found.name} in namespace {namespace!r} does not hold this server's "
            "launcher (its bytes differ from the archive it names); nothing was created. "
            f"Delete it (kubectl delete configmap {found.name} -n {namespace}) and start "
            "the kernel again"
        )
