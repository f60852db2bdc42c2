"""What the kubernetes backend sees of the namespaces its kernels use: the informers' caches.

One pod informer and one Workload informer per namespace, shared by every kernel there
(`Informers`), and each pod group's pods indexed by group as pod events arrive, so a group's
status is computed without scanning every pod. Each change is reported by group name to
`on_change`; reading never causes an API call. The caches keep what their readers need and share
what repeats (`slim`): a queued kernel costs the server memory for two cached objects, so
thousands of them fit.

Both informers select this server's own objects by its owner label (`kueue.OWNER_LABEL`), so a
server's cache and the events it is sent grow with its own kernels, not with every server's in
the namespace (a JupyterHub puts every user's server in one). We label the pods; Kueue makes the
Workloads, and gives them our owner label only where its Configuration lists the label in
`integrations.labelKeysToCopy`. `check_copied` looks at the first Workload of ours in each
namespace: one without the label turns that namespace's Workload informer to every Workload
there (as before owner selection) and `warn` says what to configure.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from kernel_queue import errors
from kernel_queue.kube import kueue, names
from kernel_queue.kube.client import verbs
from kernel_queue.kube.client.informer import Informer, Informers
from kernel_queue.kube.client.verbs import KubeApi, Resource

Obj = dict[str, Any]
POD_SELECTOR = f"{kueue.MANAGED_BY_LABEL}={kueue.MANAGED_BY}"
"""The pods kernel-queue made (the pod informers add this server's owner label)."""
COPY_CHECK_PAUSES = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Pauses (s) between looks for a namespace's first Workload of ours (`check_copied`); after
the last, the next group submitted there looks again."""


def _shared(value: Any) -> Any:
    """`value` with every string interned: the keys, images, env names, condition reasons… of
    thousands of cached objects are then one string each, not one per object."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {sys.intern(key): _shared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shared(item) for item in value]
    return value


def slim(obj: Obj) -> Obj:
    """What the caches keep of an object: all but `metadata.managedFields` (the API server's
    record of who wrote which field, often its largest part), its strings shared. Pods keep their
    whole spec: an adopted group's replacement pods are copies of them (`replacements`)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    kept: Obj = _shared(obj)
    return kept


def slim_workload(obj: Obj) -> Obj:
    """`slim`, and without its pod sets' pod templates (Kueue's copies of our pods, which
    nothing reads from the Workload: the pods themselves are cached)."""
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("podSets"), list):
        pod_sets = [
            {k: v for k, v in pod_set.items() if k != "template"}
            if isinstance(pod_set, dict)
            else pod_set
            for pod_set in spec["podSets"]
        ]
        obj = {**obj, "spec": {**spec, "podSets": pod_sets}}
    return slim(obj)


class Caches:
    """The watched namespaces; `on_change(group name)` is called on every pod or Workload event."""

    def __init__(self, on_change: Callable[[str], None], *, owner: str = "") -> None:
        """`owner`: this server's owner id; "" watches every pod of kernel-queue and every
        Workload of each namespace."""
        self._on_change = on_change
        self._informers = Informers()
        self._watched: dict[str, tuple[Informer, Informer]] = {}  # ns -> (pods, workloads)
        # (namespace, group) -> pod name -> pod: each group's pods without scanning them all
        self._pods_by_group: dict[tuple[str, str], dict[str, Obj]] = {}
        self._owner = names.label_value(owner) if owner else ""
        self.owned = f"{kueue.OWNER_LABEL}={self._owner}" if owner else ""
        """The label selector of this server's objects ("" for none)."""
        self._copied: dict[str, bool] = {}  # ns -> whether Kueue copies our owner label
        self._checking: set[str] = set()

    def namespaces(self) -> set[str]:
        """The namespaces watched so far."""
        return set(self._watched)

    async def watch(
        self, api: KubeApi, namespace: str, *, workloads: Resource, within: float
    ) -> None:
        """Start the namespace's informers (once), Workloads at the version of `workloads` (the
        connection's, `preflight.Discovery`), and wait for their first lists, which retry
        transient errors for `within` seconds; then `Unavailable` (the informers keep trying)."""
        if namespace in self._watched:
            return
        pod_selector = ",".join(filter(None, (POD_SELECTOR, self.owned)))
        try:
            async with asyncio.timeout(within):
                pods = await self._informers.get(
                    api, kueue.PODS, namespace, pod_selector, transform=slim
                )
                found = await self._informers.get(
                    api, workloads, namespace, self.owned, transform=slim_workload
                )
        except TimeoutError:
            message = f'list pods in namespace "{namespace}": the API server did not answer'
            raise verbs.Unavailable(0, "Timeout", message) from None
        if namespace not in self._watched:
            self._watched[namespace] = (pods, found)
            for pod in pods.items():
                self._index(pod, deleted=False)
            pods.add_handler(self._on_pod)
            found.add_handler(self._on_workload)

    async def check_copied(
        self,
        api: KubeApi,
        namespace: str,
        group: str,
        *,
        workloads: Resource,
        warn: Callable[[str], None],
    ) -> None:
        """Once per namespace (while none is under way): wait for `group`'s Workload (ours,
        just submitted or adopted). Seen in the cache, Kueue copies our owner label; else one
        list of that Workload by name says whether it exists without it. Then the namespace's
        Workloads are watched all (`widen`) and `warn(namespace)` is called. A Workload not
        made after `COPY_CHECK_PAUSES`, or an API error, leaves the question to the next
        group."""
        if not self.owned or namespace in self._copied or namespace in self._checking:
            return
        self._checking.add(namespace)
        try:
            for pause in COPY_CHECK_PAUSES:
                if self.workload(namespace, group) is not None:
                    self._copied[namespace] = True
                    return
                await asyncio.sleep(pause)
                if namespace not in self._watched or self.workload(namespace, group) is not None:
                    continue
                field = f"metadata.name={group}"
                items, _ = await api.list(workloads, namespace, field_selector=field)
                labels = [(w.get("metadata") or {}).get("labels") or {} for w in items]
                if any(found.get(kueue.OWNER_LABEL) != self._owner for found in labels):
                    self._copied[namespace] = False
                    await self._widen(api, namespace, workloads)
                    warn(namespace)
                    return
        except errors.ClusterApiError:
            return
        finally:
            self._checking.discard(namespace)

    async def _widen(self, api: KubeApi, namespace: str, workloads: Resource) -> None:
        """Watch every Workload of `namespace` instead of ours only; each is reported."""
        pods, owned = self._watched[namespace]
        every = await self._informers.get(api, workloads, namespace, transform=slim_workload)
        owned.remove_handler(self._on_workload)
        self._watched[namespace] = (pods, every)
        every.add_handler(self._on_workload)
        await self._informers.drop(owned)
        for workload in every.items():
            self._on_change(workload["metadata"]["name"])

    def cached(self, namespace: str) -> dict[str, list[str]]:
        """The names of the pods and Workloads held of `namespace` (what the fleet benchmark
        and the tests count): this server's own, unless the namespace was widened."""
        pods, found = self._watched.get(namespace, (None, None))
        return {
            "pods": sorted(p["metadata"]["name"] for p in pods.items()) if pods else [],
            "workloads": sorted(w["metadata"]["name"] for w in found.items()) if found else [],
        }

    def owned_pods(self, namespace: str) -> list[Obj] | None:
        """This server's pods of `namespace` as last seen; None where it is not watched, or
        where the pods are not selected by owner (no owner given)."""
        informers = self._watched.get(namespace)
        return informers[0].items() if informers and self.owned else None

    def workload(self, namespace: str, name: str) -> Obj | None:
        """The group's Workload as last seen, or None (not created yet, or gone)."""
        informers = self._watched.get(namespace)
        return informers[1].get(name) if informers else None

    def pods(self, namespace: str, name: str) -> list[Obj]:
        """The group's pods as last seen."""
        return list(self._pods_by_group.get((namespace, name), {}).values())

    async def aclose(self) -> None:
        """Stop every informer."""
        await self._informers.aclose()

    def _on_pod(self, event: str, pod: Obj, old: Obj | None) -> None:
        self._on_change(self._index(pod, deleted=event == "DELETED"))

    def _on_workload(self, event: str, workload: Obj, old: Obj | None) -> None:
        self._on_change(workload["metadata"]["name"])

    def _index(self, pod: Obj, *, deleted: bool) -> str:
        """Keep `_pods_by_group` current; return the pod's group name."""
        meta = pod["metadata"]
        name = meta.get("labels", {}).get(kueue.POD_GROUP_NAME_LABEL, "")
        key = (meta.get("namespace", ""), name)
        if deleted:
            self._pods_by_group.get(key, {}).pop(meta["name"], None)
            if not self._pods_by_group.get(key, True):
                del self._pods_by_group[key]
        else:
            self._pods_by_group.setdefault(key, {})[meta["name"]] = pod
        return str(name)
