"""The kubernetes backend: each kernel a Kueue-managed pod group, reached through its Service.

Submitting creates a Secret (the key), a ClusterIP Service (a stable address across pod
replacement), for a group of several pods a headless Service (each pod's stable DNS name, for
the others) and the group's pods, each labelled with the kernel and this server's owner id and
taken as ours on a 409 only when it carries both (`kube.objects.ownership`); Kueue gates, admits,
evicts. Before anything is created the queue, priority class and claim are checked
(`kube.objects.preflight`). One shared informer per namespace and kind (pods, Workloads) feeds every
kernel's status from memory (`kube.client.caches`); `groups` turns it into each group's status and
acts on it (replacement pods after an eviction, queue positions from Kueue's visibility API through
`kube.queueing.positions`). A release deletes every object until each is gone
(`kube.deletion.cleanup`); what keeps failing (`reaper.HandOver`), and what a crash left, the reaper
deletes (`kube.deletion.reaper`). Parking flips the Workload's `spec.active`
(`kube.queueing.activation`). `local_queue_usage` says what a LocalQueue's status counts
(`kube.queueing.capacity`). Every background task is owned and ended by
`aclose`.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from kernel_queue import errors
from kernel_queue.backends import feed, tasks
from kernel_queue.backends.kubernetes import group_state, groups, settings
from kernel_queue.kube import kueue, names
from kernel_queue.kube.client import caches, explain
from kernel_queue.kube.client.verbs import KubeApi
from kernel_queue.kube.deletion import cleanup, janitor, reaper
from kernel_queue.kube.objects import delivery, ownership, preflight, submission
from kernel_queue.kube.queueing import activation, capacity
from kernel_queue.kube.queueing import status as group_status
from kernel_queue.model import (
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    StopCause,
    short_id,
)

Obj = dict[str, Any]
Action = group_state.Action
PREVIOUS_STOP_MARGIN, PREVIOUS_STOP_POLL = 5, 0.05
"""Seconds beyond its pods' grace a relaunch waits for the previous launch's pods to stop, and
between its looks at the pod cache."""


class KubernetesBackend(settings.BackendSettings):
    """Queues kernels as Kueue pod groups. Configure it as `c.KubernetesBackend.<trait>`."""

    name = "kubernetes"
    tracks_kernel_restarts = False  # a pod's launcher restarts its kernel unseen by the API

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._api: KubeApi | None = None
        self._api_lock = asyncio.Lock()
        self._groups: dict[str, groups.Group] = {}  # group name -> group
        self._launches: dict[str, int] = {}  # kernel id -> launches so far
        self._kernels: dict[str, str] = {}  # kernel id -> namespace, while it holds objects
        self._sizes: dict[str, int] = {}  # kernel id -> pods in its group, where submitted here
        self._busy: collections.Counter[str] = collections.Counter()  # submits, releases
        self._tasks = tasks.Tasks(self.log)
        self._discovery = preflight.Discovery(self.retry)  # Kueue's versions, read once
        self._delivery = delivery.LauncherDelivery()  # the launcher's ConfigMap per namespace
        self._caches = caches.Caches(lambda name: self._statuses.refresh(name), owner=self.owner_id)
        self._statuses = groups.Statuses(
            self._groups,
            caches=self._caches,
            tasks=self._tasks,
            connect=self._client,
            create=self._create,
            owner=self.owner_id,
            namespace=lambda: self.namespace,
            position_interval=lambda: self.position_interval,
            kueue_timeout=lambda: self.kueue_timeout,
            log=self.log,
            discovery=self._discovery,
            forget_launcher=self._delivery.forget,
            activate=self._activate,
        )
        self.reaper = reaper.Reaper(
            owner=self.owner_id,
            known=lambda: ownership.REGISTRY.known(self.owner_id),
            log=self.log,
            discovery=self._discovery,
            current=lambda: self._delivery.name,
            cached_pods=self._caches.owned_pods,
        )
        self._handover = reaper.HandOver(
            self.reaper, self._client, lambda: self.reap_interval, self.log
        )
        ownership.REGISTRY.add(self, self.owner_id)

    def known_kernels(self) -> set[str]:
        """Kernel ids this backend holds objects or groups of, or is submitting or releasing."""
        groups = {g.ref.kernel_id for g in self._groups.values()}
        return groups | set(self._kernels) | {k for k, n in self._busy.items() if n > 0}

    # -- ClusterBackend ----------------------------------------------------------------------

    async def submit(self, spec: GroupSpec) -> GroupRef:
        """Create the Secret, the Service and the pods; return at once (Kueue queues them).

        Every bad input raises before anything is created; if creation fails half-way, what
        this launch created is deleted again (or handed to the reaper), and the error names
        the kernel, what failed and what to do."""
        for group in list(self._groups.values()):
            if group.ref.kernel_id == spec.kernel_id and not group.ending:
                if group.status.phase not in feed.TERMINAL:
                    return group.ref
                await self._end_group(group)
        self._busy[spec.kernel_id] += 1
        try:
            return await self._submit(spec, f"kernel {short_id(spec.kernel_id)}")
        finally:
            self._busy[spec.kernel_id] -= 1

    async def _submit(self, spec: GroupSpec, who: str) -> GroupRef:
        api = await self._client()
        namespace = spec.namespace or self.namespace
        spec = replace(spec, namespace=namespace)
        doing = f"check its queue in namespace {namespace!r}"
        try:
            await preflight.check(api, spec, namespace, self._discovery)
            await self._watch_namespace(namespace)
            doing = f"deliver the launcher to namespace {namespace!r}"
            launcher = await self._delivery.ensure(api, namespace, who)
        except errors.ClusterApiError as exc:
            raise explain.failure(exc, who=who, doing=doing, after="; nothing was created") from exc
        launch = self._launches.get(spec.kernel_id, 0)
        self._launches[spec.kernel_id] = launch + 1
        name = names.group_name(spec.kernel_id, launch)
        if launch > 0:
            await self._previous_stopped(namespace, names.group_name(spec.kernel_id, launch - 1))
        progress = submission.Progress()

        async def create(kind: kueue.Kind, body: Obj) -> Obj:
            return await self._create(api, kind, namespace, body, who)

        try:
            address = await submission.create_launch(
                spec,
                name,
                launch,
                owner=self.owner_id,
                create=create,
                progress=progress,
                launcher=launcher,
            )
        except BaseException as exc:
            after = await self._undo(api, spec, name, progress.created)  # the first cause
            if isinstance(exc, errors.ClusterApiError):
                raise explain.failure(exc, who=who, doing=progress.doing, after=after) from exc
            raise
        self._kernels[spec.kernel_id] = namespace
        self._sizes[spec.kernel_id] = spec.pod_group_size
        connection = submission.connection(spec, address)
        ref = GroupRef(self.name, name, spec.kernel_id, connection, namespace=namespace)
        spec = submission.pinned(spec, progress)  # its replacement pods keep the head's class
        self._groups[name] = groups.Group(ref=ref, queue=spec.queue, spec=spec, launcher=launcher)
        self.log.info(
            "kernel %s submitted as pod group %s in %s/%s needing %s",
            short_id(spec.kernel_id),
            name,
            namespace,
            spec.queue,
            spec.needs(),
        )
        self._statuses.refresh(name)
        self._check_copied(api, namespace, name)
        return ref

    async def _previous_stopped(self, namespace: str, previous: str) -> None:
        """Wait until the kernel's previous launch's pods have stopped (a stop's pods may still
        save within their grace): the kernel's Service publishes pods before they are Ready, so
        a head of the new launch beside a stopping one would share its clients with it. Bounded
        by those pods' grace and `PREVIOUS_STOP_MARGIN` (then the launch goes on, logged)."""

        def stopping() -> list[Obj]:
            return [
                pod
                for pod in self._caches.pods(namespace, previous)
                if (pod.get("status") or {}).get("phase") not in group_status.TERMINAL_PHASES
                and not kueue.is_gated(pod)
            ]

        pods = stopping()
        if not pods:
            return
        grace = max(_grace(pod) for pod in pods)
        deadline = time.monotonic() + grace + PREVIOUS_STOP_MARGIN
        while stopping():
            if time.monotonic() > deadline:
                self.log.warning(
                    "pod group %s/%s still has pods %s s after its stop; the next launch goes on",
                    namespace,
                    previous,
                    grace + PREVIOUS_STOP_MARGIN,
                )
                return
            await asyncio.sleep(PREVIOUS_STOP_POLL)

    def _check_copied(self, api: KubeApi, namespace: str, group: str) -> None:
        """Find out whether Kueue gives the group's Workload our owner label (once per
        namespace; `caches.Caches.check_copied`)."""

        async def check() -> None:
            workloads = (await self._discovery.versions(api)).workloads
            await self._caches.check_copied(
                api, namespace, group, workloads=workloads, warn=self._uncopied
            )

        self._tasks.spawn(check(), f"owner label of {group}")

    def _uncopied(self, namespace: str) -> None:
        self.log.warning(
            "Kueue does not copy the label %s onto the Workloads of namespace %r: this server "
            "now watches every Workload there, and with many servers in one namespace each is "
            "sent every kernel's changes. Add %s to integrations.labelKeysToCopy in Kueue's "
            "Configuration (the kueue-manager-config ConfigMap) and restart Kueue's controller",
            kueue.OWNER_LABEL,
            namespace,
            kueue.OWNER_LABEL,
        )

    def cached(self, namespace: str) -> dict[str, list[str]]:
        """The pods and Workloads of `namespace` this server holds (`caches.Caches.cached`)."""
        return self._caches.cached(namespace)

    async def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        """Yield the current status, then each change, until the group ends.

        A ref this backend does not know (a restarted server) is adopted from the cluster."""
        group = self._groups.get(ref.name)
        if group is None:
            group = await self._adopt(ref)
        async for status in feed.follow(group):
            yield status

    async def stop(self, ref: GroupRef, *, grace: float, cause: StopCause) -> None:
        """End the pod group (the Service and the Secret stay for a later launch).

        An in-place restart never gets here unless the kernel ignored its `shutdown_request`
        (the launcher restarts a kernel that exits to restart): then the group ends too, and the
        next launch queues a new one."""
        group = self._groups.get(ref.name)
        if group is not None:
            await self._end_group(group, grace=0 if cause is StopCause.KILL else grace)

    async def send_signal(self, ref: GroupRef, signum: int) -> None:
        """Pods cannot be signalled through the API; kernelspecs use message-mode interrupts."""
        self.log.debug("kernel %s: signal %d not sent (pods take none)", ref.kernel_id, signum)

    async def park(self, ref: GroupRef, *, grace: float) -> None:
        """Park a running group: `spec.active` false on its Workload (`kube.queueing.activation`);
        it reports PARKING, then PARKED. Kueue deletes its pods with their own grace (fixed when
        they were made: `grace` cannot shorten it). Does nothing unless the group runs."""
        group = self._groups.get(ref.name)
        if group is not None and Action.DEACTIVATE in group.step(
            group_state.Park(group.status.phase)
        ):
            await self._activate(group, False)

    async def resume(self, ref: GroupRef) -> None:
        """Put a parked group back in its queue (`spec.active` true); asked while it parks, once
        it is parked. Does nothing otherwise; raises a sentence when the API server refuses."""
        group = self._groups.get(ref.name)
        if group is None:
            return
        resume = group_state.Resume(group.status.phase, unlisted=groups.unlisted(group))
        if Action.WAKE in group.step(resume):  # else woken once parked with its pods listed
            await self._statuses.wake(group)  # a refusal stays said in its parked status

    async def _activate(self, group: groups.Group, active: bool) -> None:
        namespace, name = self._statuses.namespace_of(group), group.ref.name
        api = await self._client()
        await activation.switch(
            api,
            (await self._discovery.versions(api)).workloads,
            namespace,
            name,
            active=active,
            policy=self.retry,
            who=f"kernel {short_id(group.ref.kernel_id)}",
            seen=lambda: self._caches.workload(namespace, name),
        )

    async def release(self, ref: GroupRef) -> None:
        """Delete every object of the kernel: its groups (Workloads first, so Kueue frees the
        quota), any pods left, the Services and the Secret. It returns once each is gone or
        going; what keeps failing is handed to the reaper (logged once), never raised."""
        kernel, namespace = ref.kernel_id, ref.namespace or self.namespace
        self._busy[kernel] += 1
        try:
            groups = [g for g in self._groups.values() if g.ref.kernel_id == kernel]
            for group in groups:
                await self._end_group(group)
            group_names = {g.ref.name for g in groups} | {ref.name}
            grouped = self._sizes.get(kernel, 2) > 1  # adopted: its size is not known here

            async def everything(api: KubeApi) -> list[str]:
                workloads = await self._discovery.workloads(api)
                return await cleanup.delete_kernel(
                    api, namespace, kernel, group_names, workloads=workloads, grouped=grouped
                )

            await self._delete_or_hand_over(namespace, kernel, "its release", everything)
            self._launches.pop(kernel, None)
            self._kernels.pop(kernel, None)
            self._sizes.pop(kernel, None)
        finally:
            self._busy[kernel] -= 1

    async def aclose(self) -> None:
        """Stop the reaper, the position readers, every other task, the informers and the
        API client."""
        ownership.REGISTRY.remove(self)
        await self._tasks.aclose()
        self._statuses.positions.clear()
        self._statuses.waits.aclose()
        await self._caches.aclose()
        if self._api is not None:
            await self._api.aclose()
            self._api = None

    async def local_queue_usage(self, queue: str, namespace: str | None = None) -> capacity.Usage:
        """What LocalQueue `queue` (in `namespace`, default this backend's) counts now, from
        one GET of its status; raises an error whose sentence names the queue, the namespace
        and what to do (`capacity.read`)."""
        api = await self._client()  # resolves `namespace`
        return await capacity.read(api, self._discovery, namespace or self.namespace, queue)

    # -- connecting, creating, deleting --------------------------------------------------

    async def _client(self) -> KubeApi:
        """The API client, connected on first use; `namespace` is resolved then too, so that
        its default (a file of the pod's service account) is read off the event loop. The
        reaper starts with it."""
        async with self._api_lock:
            if self._api is None:
                from kernel_queue.kube.client.api import KubernetesApi

                if not self.trait_has_value("namespace"):
                    self.namespace = await asyncio.to_thread(settings.own_namespace)
                self._api = await KubernetesApi.connect(
                    self.kubeconfig, self.context, retry=self.retry
                )
                if self.reap_interval > 0 and not self._tasks.closed:
                    self._tasks.spawn(
                        self.reaper.run(self._client, self._swept, self.reap_interval), "reaper"
                    )
            return self._api

    def _swept(self) -> set[str]:
        """The namespaces the reaper sweeps: the default one and every one kernels used."""
        return {self.namespace, *self._caches.namespaces(), *self._kernels.values()}

    async def _create(
        self, api: KubeApi, kind: kueue.Kind, namespace: str, body: Obj, who: str
    ) -> Obj:
        return await ownership.create_owned(api, kind, namespace, body, who=who, policy=self.retry)

    async def _undo(
        self, api: KubeApi, spec: GroupSpec, group: str, created: list[tuple[kueue.Kind, str]]
    ) -> str:
        """Delete what a failed submit created, and the Workload of `group` Kueue made for a pod
        it created (after the pods: Kueue would make another for pods still there; one it makes
        later goes with its pods, its owners); the end of the user's sentence says how it went."""
        namespace = spec.namespace or self.namespace

        async def undo(api: KubeApi) -> list[str]:
            deleted = []
            for kind, name in reversed(created):
                if await api.delete(kind, namespace, name, grace_seconds=0):
                    deleted.append(f"{ownership.WORDS.get(kind.plural, kind.plural)} {name}")
            workloads = await self._discovery.workloads(api)
            made_pods = any(kind is kueue.PODS for kind, _ in created)
            if (
                made_pods
                and workloads is not None
                and await api.delete(workloads, namespace, group)
            ):
                deleted.append(f"Workload {group}")
            return deleted

        if not created:
            return "; nothing was left behind"
        done = await self._delete_or_hand_over(
            namespace, spec.kernel_id, "the clean-up of its failed start", undo
        )
        return "; nothing was left behind" if done else "; what it had created will be deleted"

    async def _delete_or_hand_over(
        self, namespace: str, kernel: str, what: str, work: reaper.Work
    ) -> bool:
        """Run `work`, or hand it to the reaper (`reaper.HandOver`); False when handed over."""
        return await self._handover.run(namespace, kernel, what, work)

    async def _end_group(self, group: groups.Group, *, grace: float | None = None) -> None:
        """Delete the group's Workload and pods, once: later callers wait for the same deletion,
        which runs to its end even if they are cancelled; then forget the group."""
        if Action.DELETE in group.step(group_state.Done.END):
            seconds = None if grace is None else int(grace)
            group.ended = self._tasks.spawn(
                self._delete_group(group, seconds), f"end {group.ref.name}"
            )
        if group.ended is not None:
            await asyncio.shield(group.ended)

    async def _delete_group(self, group: groups.Group, grace: int | None) -> None:
        namespace, kernel = group.ref.namespace or self.namespace, group.ref.kernel_id
        await groups.stop_replacing(group)
        # No kernel deletes a parked group's checkpoints: the janitor, once its pods are killed.
        parked = group.status.phase in (GroupPhase.PARKED, GroupPhase.PARKING)
        pods, grace = (self._caches.pods(namespace, group.ref.name), 0) if parked else ([], grace)

        async def delete(api: KubeApi) -> list[str]:
            workloads = await self._discovery.workloads(api)
            deleted = await cleanup.delete_group(
                api, namespace, kernel, group.ref.name, workloads=workloads, grace=grace
            )
            await janitor.clean(api, namespace, pods, log=self.log)
            return deleted

        try:
            await self._delete_or_hand_over(namespace, kernel, "ending its pod group", delete)
        finally:
            group.step(group_state.Done.DELETED)
            self._groups.pop(group.ref.name, None)
            final = GroupStatus(
                GroupPhase.FINISHED, message="the pod group was deleted", exit_code=0
            )
            feed.publish(group, final)

    async def _watch_namespace(self, namespace: str) -> None:
        """One pod informer and one Workload informer per namespace, for every kernel; their
        first lists retry within `api_retry_seconds`, then this gives up (they keep trying)."""
        api = await self._client()
        workloads = (await self._discovery.versions(api)).workloads
        await self._caches.watch(
            api, namespace, workloads=workloads, within=self.api_retry_seconds + 30
        )

    async def _adopt(self, ref: GroupRef) -> groups.Group:
        await self._client()  # resolves `namespace`
        namespace = ref.namespace or self.namespace
        group = groups.Group(ref=ref, queue="")
        group.step(group_state.Adopt(ran=True))  # until its pods say otherwise
        self._groups[ref.name] = group  # known to the reaper from now on
        self._kernels[ref.kernel_id] = namespace
        await self._watch_namespace(namespace)
        pods = self._caches.pods(namespace, ref.name)
        workload = self._caches.workload(namespace, ref.name)
        ran = True  # no pods to tell
        if pods:
            labels = pods[0]["metadata"].get("labels", {})
            group.queue = labels.get(kueue.QUEUE_NAME_LABEL, "")
            ran = any(kueue.pod_ready(p) for p in pods)
        if workload is not None and not kueue.workload_active(workload):
            ran = True  # parked: it ran, and its pods are gated replacements
        group.step(group_state.Adopt(ran=ran))
        self._statuses.refresh(ref.name)
        self._check_copied(await self._client(), namespace, ref.name)
        return group


def _grace(pod: Obj) -> int:
    """A pod's terminationGracePeriodSeconds (Kubernetes' default 30 where it has none)."""
    seconds = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return seconds if isinstance(seconds, int) else 30
