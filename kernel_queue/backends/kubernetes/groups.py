"""Each kernel's pod group as the kubernetes backend tracks it, and what its status asks for.

`Group` is the record of one group. `Statuses.refresh` recomputes a group's status from the
informers' caches (`kube.client.caches`) on every pod or Workload event and acts on it: it publishes
the status to the group's watchers (`feed`), creates replacement pods after an eviction (the same
shape, so Kueue keeps the Workload), follows the queue's positions while the group waits
(`kube.queueing.positions`), says why it waits and for how long it may (`waits`), fails it when its
queue could never admit it, and adds a failed pod's last log lines to its error. Every task it
starts belongs to the backend's `tasks.Tasks`; it creates objects only through the backend's
owner-checked `create`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kernel_queue import errors
from kernel_queue.backends import feed, tasks
from kernel_queue.backends.kubernetes import group_state, waits
from kernel_queue.kube import kueue
from kernel_queue.kube.client import caches, explain
from kernel_queue.kube.client.verbs import KubeApi, Resource
from kernel_queue.kube.objects import delivery, manifests, preflight, replacements
from kernel_queue.kube.queueing import launch_failures, positions
from kernel_queue.kube.queueing import status as group_status
from kernel_queue.model import GroupPhase, GroupRef, GroupSpec, GroupStatus, QueuePlace, short_id

Obj = dict[str, Any]
Create = Callable[[KubeApi, kueue.Kind, str, Obj, str], Awaitable[Obj]]
"""`create(api, kind, namespace, body, who)`: the backend's owner-checked create."""
Action = group_state.Action
UNLISTED_SECONDS = 30.0
"""How long a replacement pod made but never listed holds back the next round (one deleted
before the informer saw it, across a relist, must not block replacements for ever)."""
LOG_LINES = 20
"""Log lines of a pod that failed before it was ready, added to the kernel's error."""
LOG_SECONDS = 5.0
"""Seconds the API may take to give those lines; the error is published without them after."""
LOOK_INTERVAL, LOOKS_AT_FULL_SPEED = 0.01, 10
"""Seconds between the server's tries to reach a started kernel on its shell port while at most
`LOOKS_AT_FULL_SPEED` kernels are looked at; with more, each tries less often, so that all of
them make about 1000 tries a second (a refused connect costs the loop about 70 us)."""
LOOK_FAST_SECONDS, LOOK_SLOW_INTERVAL = 10.0, 0.5
"""After `LOOK_FAST_SECONDS`, every `LOOK_SLOW_INTERVAL` (a kernel that never listens fails its
start)."""


@dataclass(eq=False)
class Group:
    """One kernel's current pod group as this backend tracks it."""

    ref: GroupRef
    queue: str
    spec: GroupSpec | None = None  # None for a group adopted after a server restart
    launcher: str | None = None  # the ConfigMap of the launcher its pods run (replacements too)
    launcher_checked: bool = False  # this round's pod was seen stuck creating: the read is done
    launcher_gone: str = ""  # why this round's pod cannot start: its launcher ConfigMap is gone
    status: GroupStatus = field(default_factory=lambda: GroupStatus(GroupPhase.PENDING))
    place: QueuePlace | None = None
    watchers: set[asyncio.Queue[GroupStatus]] = field(default_factory=set)
    state: group_state.State = field(default_factory=group_state.State)  # moved by `step`
    unlisted: set[str] = field(default_factory=set)  # replacement pods made, not listed yet
    made_at: float = 0.0  # when the last replacement pod was made (time.monotonic())
    attempt: int = 0
    ended: asyncio.Task[None] | None = None  # the deletion, shared by every caller
    replacement: asyncio.Task[None] | None = None  # the round of replacement pods being made
    saved: str = ""  # what the last stopped pod's checkpoint saved; kept after it is deleted
    refused_wake: str = ""  # why the API server refused its last wake: said while it is parked
    # the server's own look at its head's kernel before the pod is Ready
    head_look: group_state.HeadLook = field(default_factory=group_state.HeadLook)
    since: float = field(default_factory=time.monotonic)  # submitted (or adopted): Kueue's clock

    def step(self, event: group_state.Event) -> frozenset[group_state.Action]:
        """Move the group's state (`group_state.step`); the actions are the caller's to do."""
        moved = group_state.step(self.state, event)
        self.state = moved.state
        return moved.actions

    @property
    def ending(self) -> bool:
        """Its deletion began: no more statuses, no replacement pods."""
        return self.state.ending


class Statuses:
    """Keeps the statuses of `groups` (group name -> `Group`, the backend's table) current."""

    def __init__(
        self,
        groups: dict[str, Group],
        *,
        caches: caches.Caches,
        tasks: tasks.Tasks,
        connect: Callable[[], Awaitable[KubeApi]],
        create: Create,
        owner: str,
        namespace: Callable[[], str],
        position_interval: Callable[[], float],
        log: logging.Logger | logging.LoggerAdapter[Any],
        discovery: preflight.Discovery | None = None,
        kueue_timeout: Callable[[], float] = lambda: 0.0,
        forget_launcher: Callable[[str], None] = lambda namespace: None,
        activate: Callable[[Group, bool], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self.groups, self.caches, self.tasks, self.log = groups, caches, tasks, log
        self._looks = 0  # head pods whose kernel the server is trying to reach (`_look`)
        self._forget_launcher = forget_launcher  # its ConfigMap is gone: make it again
        self._activate = activate  # the backend's park (False) and wake (True) of a group
        self._connect, self._create, self._owner = connect, create, owner
        self._namespace = namespace  # the default namespace, known once the client connected
        self.positions = positions.Readers(
            connect=connect,
            tasks=tasks,
            waiting=self.waiting,
            place=self.place,
            interval=position_interval,
            log=log,
            discovery=discovery,
            left=self._left_queue,
        )

        versions = discovery or preflight.Discovery()

        async def local_queues(api: KubeApi) -> Resource:
            return (await versions.versions(api)).local_queues

        self.waits = waits.Waits(
            connect=connect,
            local_queue_kind=local_queues,
            tasks=tasks,
            within=kueue_timeout,
            refresh=self.refresh,
            queue_read=self._queue_read,
            log=log,
        )

    def _left_queue(self, namespace: str, queue: str, names: set[str]) -> None:
        """Other servers' Workloads left the LocalQueue (ours are observed off their own)."""
        self.waits.observe_left(namespace, queue, names - self.groups.keys())

    def namespace_of(self, group: Group) -> str:
        """The group's namespace (the backend's default when its ref names none)."""
        return group.ref.namespace or self._namespace()

    def refresh(self, name: str) -> None:
        """Recompute one group's status from the informers' caches and act on it."""
        group = self.groups.get(name)
        for seen in [self.namespace_of(group)] if group else self.caches.namespaces():
            self.waits.observe(seen, self.caches.workload(seen, name))  # ours or not
        if group is None or group.ending:
            return
        namespace = self.namespace_of(group)
        workload = self.caches.workload(namespace, name)
        pods = self.caches.pods(namespace, name)
        pod_ip = group.spec is not None and group.spec.connect == "pod-ip"
        lead = group_status.head(pods)
        if lead is not None and kueue.pod_ready(lead):  # its readiness speaks from now on
            group.head_look = group.head_look.seen_ready(str(lead["metadata"].get("uid", "")))
        group.saved = group_status.saved_message(workload, pods) or group.saved
        status = group_status.group_status(
            workload,
            pods,
            place=group.place,
            was_running=group.state.ran,
            had_workload=group.state.had_workload,
            pod_ip_address=pod_ip,
            saved=group.saved,
            listening=group.head_look.reached,
        )
        if status.phase in (GroupPhase.QUEUED, GroupPhase.PENDING):
            status = self.waits.explain(
                status,
                workload,
                name=name,
                namespace=namespace,
                queue=group.queue,
                spec=group.spec,
                place=group.place,
                since=group.since,
            )
        if status.phase is GroupPhase.ADMITTED:
            status = self._launcher_check(group, name, namespace, pods, status)
            self._look_for_kernel(group, name, namespace, pods)
        if status.phase is GroupPhase.PARKED and group.refused_wake:
            status = status.evolve(message=group.refused_wake)
        if status.phase is GroupPhase.RUNNING:
            group.saved = ""
        group.unlisted -= {pod["metadata"]["name"] for pod in pods}
        actions = group.step(
            group_state.Observed(
                status.phase,
                workload=workload is not None,
                needs_replacement=group_status.needs_replacement(workload, pods),
                unlisted=unlisted(group),
                never_fits=status.never_fits,
            )
        )
        if Action.REPLACE in actions:
            group.replacement = self.tasks.spawn(self._replace(group, pods), f"replace {name}")
        if status.phase is GroupPhase.QUEUED:
            self.positions.follow(namespace, group.queue)
        if Action.WAKE in actions:
            self.tasks.spawn(self._wake(group), f"wake {name}")
        if Action.SAY_FAILURE in actions:  # with the pod's last log lines, by the task
            self.tasks.spawn(self._fail_with_logs(group, pods, status), f"fail {name}")
        if Action.PUBLISH in actions:
            feed.publish(group, status)

    def waiting(self, namespace: str, queue: str) -> list[str]:
        """The groups that wait in `queue` of `namespace` (their places are worth reading)."""
        return [
            name
            for name, g in self.groups.items()
            if g.queue == queue
            and self.namespace_of(g) == namespace
            and g.status.phase in (GroupPhase.QUEUED, GroupPhase.PENDING)
            and not g.ending
        ]

    def _queue_read(self, namespace: str, queue: str) -> None:
        """A LocalQueue was read: what its waiting groups say may change."""
        for name in self.waiting(namespace, queue):
            self.refresh(name)

    def place(self, name: str, place: QueuePlace | None) -> None:
        """The group's place in its queue, as the visibility API last said."""
        group = self.groups.get(name)
        if group is not None:
            group.place = place
            self.refresh(name)

    def _launcher_check(
        self, group: Group, name: str, namespace: str, pods: list[Obj], status: GroupStatus
    ) -> GroupStatus:
        """An admitted group whose pod is stuck creating: is its launcher ConfigMap gone?"""
        if group.launcher_gone:
            return status.evolve(message=group.launcher_gone)
        lead = group_status.head(pods)
        configmap = launch_failures.launcher_configmap(lead) if lead else None
        if lead and configmap and not group.launcher_checked and launch_failures.creating(lead):
            group.launcher_checked = True
            check = self._check_launcher(group, name, namespace, configmap)
            self.tasks.spawn(check, f"launcher of {name}")
        return status

    def _look_for_kernel(self, group: Group, name: str, namespace: str, pods: list[Obj]) -> None:
        """An admitted group whose head's kernel container runs but is not Ready: try to reach
        the kernel on its shell port (the readiness probe's check), so that the group runs as
        soon as the kernel listens, not when the kubelet next probes (every periodSeconds). Only
        for a head pod never seen Ready: after that its readiness speaks (a restart in place)."""
        lead = group_status.head(pods)
        if lead is None:
            return
        uid = str(lead["metadata"].get("uid", ""))
        endpoint = group_status.kernel_endpoint(lead)
        looking = group.head_look.start(uid) if endpoint is not None else None
        if endpoint is None or looking is None:
            return
        group.head_look = looking
        self.tasks.spawn(self._look(group, name, namespace, uid, endpoint), f"look {name}")

    async def _look(
        self, group: Group, name: str, namespace: str, uid: str, endpoint: tuple[str, int]
    ) -> None:
        """Connect to `endpoint` until it answers (then the group runs: `refresh`), or until the
        head pod is no longer that pod, started and not Ready, or the group ends."""
        started = time.monotonic()
        self._looks += 1
        try:
            while not group.ending:
                lead = group_status.head(self.caches.pods(namespace, name))
                if lead is None or lead["metadata"].get("uid") != uid:
                    return
                if group_status.kernel_endpoint(lead) != endpoint:
                    return  # Ready, restarted or ending: the pod's status speaks
                if await _answers(*endpoint):
                    group.head_look = group.head_look.answered(uid)
                    self.log.debug(
                        "kernel %s answers at %s:%s before its pod is Ready: running",
                        short_id(group.ref.kernel_id),
                        *endpoint,
                    )
                    self.refresh(name)
                    return
                await asyncio.sleep(look_interval(self._looks, time.monotonic() - started))
        finally:
            self._looks -= 1
            group.head_look = group.head_look.ended(uid)

    async def _check_launcher(
        self, group: Group, name: str, namespace: str, configmap: str
    ) -> None:
        await asyncio.sleep(delivery.MOUNT_GRACE)
        lead = group_status.head(self.caches.pods(namespace, name))
        if group.ending or lead is None or not launch_failures.creating(lead):
            return
        try:
            missing = await delivery.gone(await self._connect(), namespace, configmap)
        except errors.ClusterApiError as exc:
            self.log.debug("cannot read the launcher ConfigMap %s: %s", configmap, exc)
            return
        if missing:
            group.launcher_gone = launch_failures.missing_launcher(configmap, namespace)
            self._forget_launcher(namespace)
            self.refresh(name)

    async def wake(self, group: Group) -> None:
        """Wake a parked group; a refusal is raised and said in its parked status until a
        wake succeeds (every refresh keeps it there: the notebook reads it)."""
        if self._activate is None:
            return
        try:
            await self._activate(group, True)
        except errors.KernelQueueError as exc:
            group.refused_wake = str(exc)
            feed.publish(group, group.status.evolve(message=group.refused_wake))
            raise
        group.refused_wake = ""

    async def _wake(self, group: Group) -> None:
        """A resume asked while the group parked, now that it is parked (a task: a refusal is
        logged and said in its status; it stays parked)."""
        try:
            await self.wake(group)
        except errors.KernelQueueError as exc:
            self.log.warning("%s", exc)

    async def _fail_with_logs(self, group: Group, pods: list[Obj], status: GroupStatus) -> None:
        """A pod that failed before it was ready: its last log lines make the error."""
        lead = group_status.head(pods)
        tail = ""
        if lead is not None:
            api = await self._connect()
            try:
                async with asyncio.timeout(LOG_SECONDS):
                    text = await api.read_log(
                        lead["metadata"]["namespace"],
                        lead["metadata"]["name"],
                        container="kernel",
                        tail_lines=LOG_LINES,
                    )
                if text.strip():
                    tail = f"; its last log lines:\n{text.rstrip()}"
            except (errors.ClusterApiError, TimeoutError) as exc:
                self.log.debug("no log lines of %s: %s", lead["metadata"]["name"], exc)
        feed.publish(group, status.evolve(message=status.message + tail))

    async def _replace(self, group: Group, pods: list[Obj]) -> None:
        """Replacement pods after an eviction: the same shape, so Kueue keeps the Workload.
        Transient create failures are retried; a lasting one fails the kernel with a sentence.
        The group's deletion cancels the round and waits for it (`stop_replacing`)."""
        who = f"kernel {short_id(group.ref.kernel_id)}"
        namespace = self.namespace_of(group)
        try:
            api = await self._connect()
            group.attempt += 1
            group.launcher_checked, group.launcher_gone = False, ""
            if group.spec is not None:
                spec = group.spec
                fresh = manifests.pods(
                    spec,
                    group.ref.name,
                    group.attempt,
                    kernel_env=spec.env,
                    checkpoint_claim=preflight.claim(spec),
                    owner=self._owner,
                    launcher=group.launcher,
                )
            else:  # adopted after a server restart: copy the pods Kueue last saw
                fresh = replacements.copies(pods, group.attempt)
            fresh = replacements.carrying(fresh, group.saved)
            for pod in fresh:
                if group.ending:
                    return  # released meanwhile (a failed kernel, a shutdown): make nothing
                # Marked before the create: the informer may list it before the create returns.
                group.unlisted.add(pod["metadata"]["name"])
                group.made_at = time.monotonic()
                try:
                    await self._create(api, kueue.PODS, namespace, pod, who)
                except BaseException:
                    group.unlisted.discard(pod["metadata"]["name"])
                    raise
                # Looked at again once the hold lapses, should no event come meanwhile.
                asyncio.get_running_loop().call_later(
                    UNLISTED_SECONDS, self.refresh, group.ref.name
                )
            self.log.info(
                "%s: replacement pods created for group %s (round %d)",
                who,
                group.ref.name,
                group.attempt,
            )
        except errors.ClusterApiError as exc:
            if group.ending:
                return
            text = str(explain.failure(exc, who=who, doing="create its replacement pod"))
            self.log.warning("%s", text)
            feed.publish(group, GroupStatus(GroupPhase.FAILED, message=_without(who, text)))
        finally:
            if Action.REFRESH in group.step(group_state.Done.REPLACED):
                self.refresh(group.ref.name)  # a wake held back for this round goes on now


async def stop_replacing(group: Group) -> None:
    """Cancel the group's round of replacement pods and wait for it to end: a deletion that
    lists the group's pods after this finds every pod the round made, and no create of it
    (a retry after a refusal) lands once its Workload is deleted, where Kueue would make a
    Workload for that pod again."""
    if group.replacement is not None and not group.replacement.done():
        group.replacement.cancel()
        await asyncio.wait({group.replacement})


def replacing(group: Group) -> bool:
    """Its replacement pods are being made or not listed yet: a wake now would have Kueue admit
    it with only the pod that stopped, read as the kernel ending ('the kernel ended')."""
    return group.state.replacing or unlisted(group)


def unlisted(group: Group) -> bool:
    """The last round's replacement pods are not all listed yet, and were made lately."""
    return bool(group.unlisted) and time.monotonic() - group.made_at < UNLISTED_SECONDS


def look_interval(looking: int, elapsed: float) -> float:
    """Seconds before a look's next try, `elapsed` seconds into it, while `looking` looks run:
    `LOOK_INTERVAL` for up to `LOOKS_AT_FULL_SPEED` of them, longer for more (about 1000 tries a
    second in all), `LOOK_SLOW_INTERVAL` after `LOOK_FAST_SECONDS`."""
    if elapsed >= LOOK_FAST_SECONDS:
        return LOOK_SLOW_INTERVAL
    return LOOK_INTERVAL * max(1.0, looking / LOOKS_AT_FULL_SPEED)


async def _answers(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port opens within a second (a ZeroMQ socket takes a
    connection that closes at once without a word)."""
    try:
        async with asyncio.timeout(1.0):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _without(who: str, text: str) -> str:
    """`text` without its leading "kernel 1a2b3c4d: " (the lifecycle names the kernel itself)."""
    return text.removeprefix(f"{who}: ")
