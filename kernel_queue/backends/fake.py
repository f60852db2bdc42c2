"""`FakeBackend`: a `ClusterBackend` whose groups do what a test says, with no process at all.

Shipped for tests of kernel sessions and of both front ends (`tests/core/test_session.py`);
production code never imports it (an import-linter contract). A group is queued at submit and
then admitted, run, evicted, requeued, restarted, finished or failed as the test scripts; its
kernel "answers" kernel_info and heartbeats through the backend's `probe`. Every call is
recorded, and the next submit, stop or release can be made to fail.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from kernel_queue import backends
from kernel_queue.backends import feed
from kernel_queue.model import (
    ConnectionInfo,
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    QueuePlace,
    StopCause,
    group_name,
)


@dataclass(eq=False)
class FakeGroup:
    """One submitted group and what was done to it."""

    spec: GroupSpec
    ref: GroupRef
    status: GroupStatus
    watchers: set[asyncio.Queue[GroupStatus]] = field(default_factory=set)
    answering: bool = False  # its kernel answers kernel_info requests and heartbeats
    stops: list[tuple[StopCause, float]] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)
    released: int = 0
    parks: list[float] = field(default_factory=list)  # the grace of each park asked
    resumes: int = 0


class FakeProbe:
    """Answers for the kernels of one `FakeBackend`, found by their heartbeat port."""

    def __init__(self, backend: FakeBackend) -> None:
        self._backend = backend

    async def answers(self, connection: ConnectionInfo, address: str) -> None:
        """Return once the group's kernel answers (`FakeBackend.run`, `answer`)."""
        while True:
            group = self._backend.by_port(connection.hb_port)
            if group is not None and group.answering:
                return
            await self._backend.changed()

    async def heartbeat(self, address: str, port: int, *, alive: bool, within: float) -> bool:
        """Wait until the kernel answers (`alive`) or stops answering; False after `within`."""
        try:
            async with asyncio.timeout(within):
                while True:
                    group = self._backend.by_port(port)
                    if (group is not None and group.answering) == alive:
                        return True
                    await self._backend.changed()
        except TimeoutError:
            return False


class FakeBackend:
    """A scripted backend. `runs_at_once`: a submitted group is admitted and its kernel runs
    and answers at once. `tracks_kernel_restarts`: statuses report kernel processes (as the
    local backend's); else a restart in place is seen only through the heartbeat (pods)."""

    def __init__(
        self,
        *,
        name: str = "local",
        tracks_kernel_restarts: bool = True,
        runs_at_once: bool = False,
    ) -> None:
        self.name = name
        self.tracks_kernel_restarts = tracks_kernel_restarts
        self.runs_at_once = runs_at_once
        self.probe = FakeProbe(self)
        self.groups: dict[str, FakeGroup] = {}  # kernel id -> its latest group
        self.submitted: list[GroupSpec] = []
        self.released: list[GroupRef] = []
        self.closed = False
        self._failures: dict[str, list[BaseException]] = {}
        self._ports = itertools.count(40000, 5)
        self._tick = asyncio.Event()

    def serve(self, owner: Any) -> FakeBackend:
        """Be the backend `name` of everything `owner` (a kernel manager, an event loop) runs,
        so that a provisioner or a proxy given that owner uses this fake."""
        backends._shared.setdefault(owner, {})[self.name] = self
        return self

    def fail_next(self, method: str, error: BaseException) -> None:
        """Make the next call of `method` ("submit", "stop" or "release") raise `error`."""
        self._failures.setdefault(method, []).append(error)

    # -- ClusterBackend --------------------------------------------------------------------

    async def submit(self, spec: GroupSpec) -> GroupRef:
        """Queue the group (or return the ref of the kernel's group that has not ended)."""
        self._maybe_fail("submit")
        existing = self.groups.get(spec.kernel_id)
        if existing is not None and existing.status.phase not in feed.TERMINAL:
            return existing.ref
        self.submitted.append(spec)
        first = next(self._ports)
        connection = spec.connection.with_ports(tuple(range(first, first + 5)))
        ref = GroupRef(self.name, group_name(spec.kernel_id), spec.kernel_id, connection)
        queued = GroupStatus(GroupPhase.QUEUED, place=QueuePlace(spec.queue, 1, 1))
        self.groups[spec.kernel_id] = FakeGroup(replace(spec, connection=connection), ref, queued)
        if self.runs_at_once:
            self.admit(spec.kernel_id)
            self.run(spec.kernel_id)
        return ref

    async def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        """The group's status, then each change, until it ends; a ref never seen is gone."""
        async for status in feed.follow(self._find(ref)):
            yield status

    async def stop(self, ref: GroupRef, *, grace: float, cause: StopCause) -> None:
        """Record the stop; RESTART restarts the kernel in place, others end the group."""
        self._maybe_fail("stop")
        group = self._find(ref)
        if group is None:
            return
        group.stops.append((cause, grace))
        if cause is StopCause.RESTART:
            self.restart_in_place(ref.kernel_id)
        elif group.status.phase is GroupPhase.RUNNING:
            self.finish(ref.kernel_id, -9 if cause is StopCause.KILL else 0)
        else:
            self.finish(ref.kernel_id, 0, message="removed from the queue")

    async def park(self, ref: GroupRef, *, grace: float) -> None:
        """Record the park; a running group reports PARKING (a test then calls `parked`)."""
        self._maybe_fail("park")
        group = self._find(ref)
        if group is not None and group.status.phase is GroupPhase.RUNNING:
            group.parks.append(grace)
            self._publish(group, group.status.evolve(phase=GroupPhase.PARKING, message=""))

    async def resume(self, ref: GroupRef) -> None:
        """A parked group goes back to its queue, first in line."""
        self._maybe_fail("resume")
        group = self._find(ref)
        if group is not None and group.status.phase is GroupPhase.PARKED:
            group.resumes += 1
            self.queue(ref.kernel_id, 1, 1)

    async def send_signal(self, ref: GroupRef, signum: int) -> None:
        group = self._find(ref)
        if group is not None:
            group.signals.append(signum)

    async def release(self, ref: GroupRef) -> None:
        """Record the release and end the group (a scripted failure leaves it as it was)."""
        self._maybe_fail("release")
        self.released.append(ref)
        group = self._find(ref)
        if group is not None:
            group.released += 1
            if group.status.phase not in feed.TERMINAL:
                self.finish(ref.kernel_id, 0, message="released")

    async def aclose(self) -> None:
        """Release every group not released yet, as a real backend's close does."""
        self.closed = True
        for group in list(self.groups.values()):
            if not group.released:
                await self.release(group.ref)

    # -- what a test scripts -----------------------------------------------------------------

    def group(self, kernel_id: str) -> FakeGroup:
        """The kernel's latest group."""
        return self.groups[kernel_id]

    def queue(self, kernel_id: str, position: int, length: int, *, message: str = "") -> None:
        group = self.group(kernel_id)
        place = QueuePlace(group.spec.queue, position, length)
        self._publish(group, GroupStatus(GroupPhase.QUEUED, place=place, message=message))

    def admit(self, kernel_id: str, *, devices: tuple[str, ...] = ()) -> None:
        group = self.group(kernel_id)
        self._publish(group, GroupStatus(GroupPhase.ADMITTED, flavor="fake", devices=devices))

    def run(self, kernel_id: str, *, answering: bool = True) -> None:
        """The kernel process runs (generation 0 of this admission); it answers if asked to."""
        group = self.group(kernel_id)
        group.answering = answering
        status = group.status.evolve(phase=GroupPhase.RUNNING, generation=0, kernel_alive=True)
        self._publish(group, status.evolve(message=""))

    def answer(self, kernel_id: str) -> None:
        """The running kernel starts answering (its start-up code ended)."""
        self.group(kernel_id).answering = True
        self._wake()

    def evict(self, kernel_id: str, message: str = "preempted by a higher-priority kernel") -> None:
        group = self.group(kernel_id)
        group.answering = False
        status = group.status.evolve(phase=GroupPhase.EVICTED, message=message, kernel_alive=False)
        self._publish(group, status)

    def restart_in_place(self, kernel_id: str) -> None:
        """What a launcher does on `shutdown_request(restart=True)`: the kernel process exits
        and the next one starts in the same admission."""
        self.kernel_exits(kernel_id)
        self.kernel_starts(kernel_id)

    def parked(self, kernel_id: str, *, message: str = "saved 2 variables, 1.0 KiB") -> None:
        """The parking kernel saved and gave its admission back."""
        self._publish(self.group(kernel_id), GroupStatus(GroupPhase.PARKED, message=message))

    def kernel_exits(self, kernel_id: str) -> None:
        """The kernel process ends and its launcher stays (reported only where the backend
        tracks kernel processes; a pod's heartbeat stops)."""
        group = self.group(kernel_id)
        group.answering = False
        if self.tracks_kernel_restarts:
            self._publish(group, group.status.evolve(kernel_alive=False))
        self._wake()

    def kernel_starts(self, kernel_id: str) -> None:
        """The launcher's next kernel process runs and answers."""
        group = self.group(kernel_id)
        group.answering = True
        if self.tracks_kernel_restarts:
            before = group.status
            self._publish(group, before.evolve(kernel_alive=True, generation=before.generation + 1))
        self._wake()

    def finish(self, kernel_id: str, code: int, *, message: str = "") -> None:
        group = self.group(kernel_id)
        group.answering = False
        text = message or f"the kernel exited with code {code}"
        self._publish(group, GroupStatus(GroupPhase.FINISHED, message=text, exit_code=code))

    def fail(self, kernel_id: str, message: str) -> None:
        group = self.group(kernel_id)
        group.answering = False
        self._publish(group, GroupStatus(GroupPhase.FAILED, message=message))

    # -- internals ---------------------------------------------------------------------------

    def by_port(self, hb_port: int) -> FakeGroup | None:
        """The group whose kernel listens on `hb_port`."""
        for group in self.groups.values():
            if group.ref.connection.hb_port == hb_port:
                return group
        return None

    async def changed(self) -> None:
        """Return at the next change of any group."""
        await self._tick.wait()

    def _find(self, ref: GroupRef) -> FakeGroup | None:
        group = self.groups.get(ref.kernel_id)
        return group if group is not None and group.ref == ref else None

    def _publish(self, group: FakeGroup, status: GroupStatus) -> None:
        feed.publish(group, status)
        self._wake()

    def _wake(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    def _maybe_fail(self, method: str) -> None:
        pending = self._failures.get(method)
        if pending:
            raise pending.pop(0)
