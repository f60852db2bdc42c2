"""The fake Kueue for plain pods and pod groups: wiring, loop, controls, visibility.

`install()` adds the pod webhook and store listeners; each coalesced pass on the event loop
reconciles every affected (namespace, Workload) (`groups`), then schedules every affected
ClusterQueue through `kernel_queue.admission` (`scheduler`). Tests let it admit by policy or by
hand (`manual` + `admit`), evict, preempt, change quota and read queue positions, the pending
workloads of Kueue's visibility API (`visibility`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import conversion, queues, releases, visibility
from kernel_queue_fake_cluster.kueue import workload as kw
from kernel_queue_fake_cluster.kueue.client import G, KueueClient, full_name
from kernel_queue_fake_cluster.kueue.conversion import HUB
from kernel_queue_fake_cluster.kueue.groups import GroupReconciler, Key
from kernel_queue_fake_cluster.kueue.scheduler import Scheduler
from kernel_queue_fake_cluster.kueue.webhook import PodWebhook, default_namespace_selector

log = logging.getLogger(__name__)
_CONFIG = ("localqueues", "clusterqueues", "resourceflavors", "workloadpriorityclasses")


class FakeKueue:
    """Kueue's pod integration, scheduler and visibility API over one `Store`."""

    def __init__(
        self,
        store: Store,
        *,
        namespace: str = k.DEFAULT_NAMESPACE,
        managed_jobs_namespace_selector: Obj | None = None,
        manual: bool = False,
        topology: bool = True,
        release: releases.Release | None = None,
        label_keys_to_copy: Sequence[str] = (),
    ) -> None:
        """`namespace`: Kueue's own (never managed). `managed_jobs_namespace_selector`: a
        LabelSelector, `{}` for every namespace, None for Kueue's default (all but kube-system
        and `namespace`). `manual`: admit nothing until `admit()`. `topology`: add the
        `kueue.x-k8s.io/topology` gate, as with TopologyAwareScheduling on (Kueue's default).
        `release`: the Kueue release whose reasons and defaults it has (default 0.19).
        `label_keys_to_copy`: its Configuration's `integrations.labelKeysToCopy`, the pod
        labels a new Workload gets (none by default, as Kueue's)."""
        self.store = store
        self.release = release or releases.RELEASES[releases.DEFAULT]
        self.client = KueueClient(store)
        selector = managed_jobs_namespace_selector
        if selector is None:
            selector = default_namespace_selector(namespace)
        self.webhook = PodWebhook(
            store,
            namespace,
            selector,
            topology,
            priority_class_defaulting=self.release.priority_class_defaulting,
        )
        self.groups = GroupReconciler(
            self.client,
            topology=topology,
            touch=self._touch,
            release=self.release,
            label_keys_to_copy=label_keys_to_copy,
        )
        self.scheduler = Scheduler(self.client, manual=manual, release=self.release)
        self.errors: list[Exception] = []  # reconcile failures, for tests to assert on
        self._dirty: set[Key] = set()
        self._dirty_queues: set[str] = set()
        self._seen: dict[tuple[str, str, str], Any] = {}
        self._scheduled = False
        self._next_pass = 0.0  # loop time before which no pass starts (see `_wake`)

    @property
    def manual(self) -> bool:
        return self.scheduler.manual

    @manual.setter
    def manual(self, value: bool) -> None:
        self.scheduler.manual = value
        self._all_queues_dirty()

    def install(self) -> None:
        """Register Kueue's conversion webhook for its kinds, the pod webhook and the listeners.
        Install it before `pod_rules.install(store)` (the apiserver's pod rules), so the
        SchedulingGated condition sees Kueue's gates."""
        for plural in conversion.PLURALS:
            self.store.add_conversion(G, plural, conversion.convert)
        self.store.add_admission("", "pods", self.webhook)
        self.store.add_listener("", "pods", self._on_pod)
        self.store.add_listener(G, "workloads", self._on_workload)
        for plural in _CONFIG:
            self.store.add_listener(G, plural, self._on_config)
        self.store.add_listener("", "namespaces", self._on_config)
        for pod in list(self.store.objects("", "pods")):
            self._on_pod("ADDED", pod)
        for wl in self.client.objects("workloads"):
            self._on_workload("ADDED", wl)
        self._all_queues_dirty()

    # -- change tracking and the coalesced pass ------------------------------------------------

    def _on_pod(self, event: str, pod: Obj) -> None:
        self._dirty |= self.groups.index(event, pod)
        self._wake()

    def _on_workload(self, event: str, wl: Obj) -> None:
        self.scheduler.saw(wl)
        self._dirty.add((wl["metadata"]["namespace"], wl["metadata"]["name"]))
        self._dirty_queues |= self.scheduler.cluster_queues_of(wl)
        self._wake()

    def _on_config(self, event: str, obj: Obj) -> None:
        """Queues, flavors, priority classes and namespaces: every queue may be affected."""
        meta = obj["metadata"]
        spec = {key: v for key, v in obj.items() if key not in ("metadata", "status")}
        spec["labels"] = meta.get("labels")
        ident = (obj.get("kind", ""), meta.get("namespace", ""), meta["name"])
        if event == "MODIFIED" and self._seen.get(ident) == spec:
            return  # a status write, which no Kueue controller reads
        self._seen[ident] = None if event == "DELETED" else spec
        if obj.get("kind") == "ClusterQueue":
            self._dirty_queues.add(meta["name"])
        if obj.get("kind") == "WorkloadPriorityClass":
            self._dirty |= self.groups.blocked
        self._all_queues_dirty()

    def _all_queues_dirty(self) -> None:
        """Every ClusterQueue, and every one a LocalQueue names (it may not exist)."""
        named = [cq["metadata"]["name"] for cq in self.client.objects("clusterqueues")]
        named += [
            (lq.get("spec") or {}).get("clusterQueue", "")
            for lq in self.client.objects("localqueues")
        ]
        self._dirty_queues.update(name for name in named if name)
        self._wake()

    def _touch(self, group: Key) -> None:
        self._dirty.add(group)
        self._wake()

    def _wake(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the next change, or `settle`, runs the pass
        self._scheduled = True
        # A pass costs time in proportion to the Workloads; leaving at least as long again
        # before the next one batches bursts (300 pods: a few passes, not 300) and keeps the
        # loop free for the API server. A small cluster still gets its pass at once.
        delay = self._next_pass - loop.time()
        if delay > 0:
            loop.call_later(delay, self._run)
        else:
            loop.call_soon(self._run)

    def _run(self) -> None:
        """One pass: each dirty group once, then each dirty ClusterQueue once."""
        self._scheduled = False
        loop = asyncio.get_running_loop()
        started = loop.time()
        groups, self._dirty = self._dirty, set()
        for group in sorted(groups):
            self._guard(self.groups.reconcile, group)
        if self._dirty_queues:
            dirty, self._dirty_queues = self._dirty_queues, set()
            self._guard(self.scheduler.schedule, dirty)
        finished = loop.time()
        self._next_pass = finished + (finished - started)

    def _guard(self, step: Callable[[Any], None], arg: object) -> None:
        try:
            step(arg)
        except Exception as exc:
            log.exception("fake Kueue: %s(%s) failed", step.__name__, arg)
            self.errors.append(exc)

    async def settle(self, within: float = 5.0) -> None:
        """Wait until no change waits to be reconciled (at most `within` seconds)."""
        self._wake()
        async with asyncio.timeout(within):
            quiet = 0
            while quiet < 3:
                await asyncio.sleep(0)
                busy = self._scheduled or self._dirty or self._dirty_queues
                quiet = 0 if busy else quiet + 1

    # -- explicit controls for tests -----------------------------------------------------------

    def admit(self, name: str, namespace: str | None = None) -> None:
        """Let Workload `name` (a group's name) be admitted at the next pass by its queue's
        rules (quota, priority, preemption); in manual mode nothing else is."""
        wl = self._find(name, namespace)
        self.scheduler.allowed.add(self.scheduler.request(wl).name)
        self._dirty_queues |= self.scheduler.cluster_queues_of(wl)
        self._wake()

    def evict(
        self,
        name: str,
        namespace: str | None = None,
        *,
        reason: str = "PodsReadyTimeout",
        message: str = "",
    ) -> None:
        """Evict an admitted Workload as Kueue does for `reason` (PodsReadyTimeout,
        AdmissionCheck, …): Evicted is set, each pod gets TerminationTarget and a graceful
        DELETE, and the quota is released once no pod of the group runs."""
        wl = self._reserved(name, namespace)
        if not message and reason == "PodsReadyTimeout":
            message = f"Exceeded the PodsReady timeout {full_name(wl)}"
        self.scheduler.evict(wl, reason, message or reason)

    def preempt(self, name: str, namespace: str | None = None, *, by: str | None = None) -> None:
        """Preempt an admitted Workload within its ClusterQueue (in favour of Workload `by`)."""
        wl = self._reserved(name, namespace)
        cq_name = wl["status"]["admission"]["clusterQueue"]
        cq = self.client.get("clusterqueues", None, cq_name) or {"metadata": {"name": cq_name}}
        self.scheduler.preempt(wl, self._find(by, namespace) if by else None, cq)

    def set_quota(self, cluster_queue: str, flavor: str, quota: Mapping[str, str | int]) -> None:
        """Set nominal quotas of `flavor` in `cluster_queue`, e.g. `{"nvidia.com/gpu": 2}`."""
        # At the stored version: resourceGroups read alike at both, and 0.14's fungibility
        # values (Borrow) have no v1beta2 spelling to come back from.
        cq = self.store.get(G, "clusterqueues", None, cluster_queue)
        for resource, value in quota.items():
            entries = [
                entry
                for group in cq["spec"].get("resourceGroups") or []
                if resource in group.get("coveredResources", [])
                for entry in group.get("flavors") or []
                if entry["name"] == flavor
            ]
            if not entries:
                raise ValueError(
                    f"ClusterQueue {cluster_queue} has no flavor {flavor} for {resource}"
                )
            resources = entries[0].setdefault("resources", [])
            found = [r for r in resources if r["name"] == resource]
            if found:
                found[0]["nominalQuota"] = value
            else:
                resources.append({"name": resource, "nominalQuota": value})
        self.store.replace(G, "clusterqueues", None, cluster_queue, cq)

    def _find(self, name: str, namespace: str | None) -> Obj:
        found = [
            wl
            for wl in self.client.objects("workloads")
            if wl["metadata"]["name"] == name and namespace in (None, wl["metadata"]["namespace"])
        ]
        if len(found) != 1:
            raise KeyError(f"{len(found)} Workloads named {name!r} in namespace {namespace!r}")
        return self.store.get(G, "workloads", found[0]["metadata"]["namespace"], name, version=HUB)

    def _reserved(self, name: str, namespace: str | None) -> Obj:
        wl = self._find(name, namespace)
        if not kw.has_reservation(wl):
            raise ValueError(f"Workload {full_name(wl)} holds no quota")
        return wl

    # -- visibility: pending workloads in queue order -----------------------------------------

    def cluster_queue_pending(self, name: str) -> list[Obj] | None:
        """PendingWorkload items of a ClusterQueue in queue order; None if it does not exist."""
        ordered = self.scheduler.pending_order(name)
        if ordered is None:
            return None
        seen: dict[str, int] = {}
        items = []
        for index, (wl, request) in enumerate(ordered):
            items.append(queues.pending_item(wl, index, seen.get(request.queue, 0)))
            seen[request.queue] = seen.get(request.queue, 0) + 1
        return items

    def local_queue_pending(self, namespace: str, name: str) -> list[Obj] | None:
        """PendingWorkload items of a LocalQueue in queue order; None if it does not exist."""
        lq = self.client.get("localqueues", namespace, name)
        if lq is None:
            return None
        items = self.cluster_queue_pending((lq.get("spec") or {}).get("clusterQueue", "")) or []
        return [
            item
            for item in items
            if (item["metadata"]["namespace"], item["localQueueName"]) == (namespace, name)
        ]

    def pending_workloads_for_local_queue(
        self, namespace: str, name: str, *, limit: int = 1000, offset: int = 0
    ) -> Obj:
        """The body of `GET …/namespaces/<ns>/localqueues/<name>/pendingworkloads`; 404 if the
        LocalQueue does not exist."""
        items = self.local_queue_pending(namespace, name)
        return visibility.summary(items, "localqueue", name, limit=limit, offset=offset)

    def pending_workloads_for_cluster_queue(
        self, name: str, *, limit: int = 1000, offset: int = 0
    ) -> Obj:
        """The body of `GET …/clusterqueues/<name>/pendingworkloads`; 404 if it does not exist."""
        items = self.cluster_queue_pending(name)
        return visibility.summary(items, "clusterqueue", name, limit=limit, offset=offset)
