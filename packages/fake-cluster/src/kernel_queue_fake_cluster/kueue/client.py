"""The fake Kueue's access to the store: reads, Workload and pod writes, and Events.

Shared by the pod group reconciler (`groups`) and the scheduler (`scheduler`). Kueue's objects
are read and written at `conversion.HUB` (v1beta2) whatever version the cluster stores, so the
controller knows one shape (the store converts, as for a client at that version). Reads return
copies (None when absent); writes go through the store's verbs, so admission hooks, schema
validation and listeners see them as they see any client's writes.
"""

from __future__ import annotations

import uuid

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, now_rfc3339
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue.conversion import HUB

G = k.KUEUE_GROUP
CORE = ("pods", "namespaces", "events")


class KueueClient:
    """What a controller-runtime client and event recorder do for Kueue, over one Store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._events: dict[tuple[str, str, str], tuple[str, str]] = {}

    def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        """A copy of the object (a Kueue one at the hub version); None when absent."""
        group, version = ("", "") if plural in CORE else (G, HUB)
        try:
            return self.store.get(group, plural, namespace, name, version=version)
        except ApiError:
            return None

    def objects(self, plural: str) -> list[Obj]:
        """The Kueue objects of `plural` at the hub version, [] if not served: the stored ones
        themselves (read-only) where the cluster stores that version, else converted copies."""
        rtype = self.store.types.get((G, plural))
        if rtype is None:
            return []
        if rtype.storage_version == HUB:
            return list(self.store.objects(G, plural))
        return [self.store.versions.at(rtype, obj, HUB) for obj in self.store.objects(G, plural)]

    def create(self, plural: str, namespace: str | None, obj: Obj) -> Obj:
        """POST a Kueue object given at the hub version; returns it as stored."""
        return self.store.create(G, plural, namespace, obj, version=HUB)

    def replace(
        self, plural: str, namespace: str | None, name: str, obj: Obj, *, subresource: str = ""
    ) -> Obj:
        """PUT a Kueue object given at the hub version (`subresource`: "status")."""
        return self.store.replace(
            G, plural, namespace, name, obj, subresource=subresource, version=HUB
        )

    def workload(self, namespace: str, name: str) -> Obj | None:
        return self.get("workloads", namespace, name)

    def write_status(self, wl: Obj) -> None:
        """Write `wl`'s status (status subresource) if it differs from the stored one."""
        current = self.workload(*key(wl))
        if current is not None and current.get("status") != wl.get("status"):
            current["status"] = wl["status"]
            self.replace("workloads", *key(wl), current, subresource="status")

    def remove_finalizer(self, wl: Obj) -> None:
        """Drop `kueue.x-k8s.io/resource-in-use` from the Workload."""
        current = self.workload(*key(wl))
        finalizers = (current or {}).get("metadata", {}).get("finalizers") or []
        if current is not None and k.RESOURCE_IN_USE_FINALIZER in finalizers:
            kept = [f for f in finalizers if f != k.RESOURCE_IN_USE_FINALIZER]
            current["metadata"]["finalizers"] = kept
            self.replace("workloads", *key(wl), current)

    def finalize(self, pods: list[Obj]) -> None:
        """Remove Kueue's pod finalizer `kueue.x-k8s.io/managed` (Kueue drops it once the
        Workload finished or is deleted, or the pod was replaced, is excess or has no group)."""
        for pod in pods:
            current = self.get("pods", *key(pod))
            finalizers = (current or {}).get("metadata", {}).get("finalizers") or []
            if current is not None and k.POD_FINALIZER in finalizers:
                current["metadata"]["finalizers"] = [f for f in finalizers if f != k.POD_FINALIZER]
                self.store.replace("", "pods", *key(pod), current)

    def delete_pod(self, pod: Obj) -> bool:
        """A plain DELETE (the pod's own grace period); False if it is already gone."""
        try:
            self.store.delete("", "pods", *key(pod))
        except ApiError as exc:
            if exc.code != 404:
                raise
            return False
        return True

    def event(self, obj: Obj, kind: str, reason: str, message: str) -> None:
        """A core v1 Event about `obj`; a repeat bumps `count` as the event recorder does."""
        if ("", "events") not in self.store.types:
            return
        meta, now = obj["metadata"], now_rfc3339()
        ident = (meta.get("uid", ""), reason, message)
        if ident in self._events and (event := self.get("events", *self._events[ident])):
            event.update(count=int(event.get("count", 1)) + 1, lastTimestamp=now)
            self.store.replace("", "events", *self._events[ident], event)
            return
        ns, name = meta.get("namespace") or "default", f"{meta['name']}.{uuid.uuid4().hex[:16]}"
        self._events[ident] = (ns, name)
        api_version = obj.get("apiVersion", "v1")
        for rtype in self.store.types.values():  # a Kueue object at the version stored
            if (rtype.group, rtype.kind) == (G, obj.get("kind")):
                api_version = rtype.api_version()
        involved = {
            "apiVersion": api_version,
            "kind": obj.get("kind", "Pod"),
            **{field: meta.get(field) for field in ("name", "namespace", "uid")},
        }
        body = {
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": involved,
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "kueue"},
            "reportingComponent": "kueue",
        }
        self.store.create("", "events", ns, body)


def key(obj: Obj) -> tuple[str, str]:
    """(namespace, name) of a namespaced object."""
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def full_name(obj: Obj) -> str:
    return "/".join(key(obj))
