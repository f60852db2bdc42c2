"""The local backend: Kueue's queue semantics on one workstation, shared by the whole machine.

GPUs (detected from the NVIDIA driver, or configured), CPU and memory are one ClusterQueue with
one flavor. Who runs, who waits and who is preempted is decided for every local backend of this
user on this machine (any Jupyter server, nbconvert or papermill run) by the machine's queue
service (`kernel_queue.machine`, running `admission.py`), reached through `machine_link`. Each
admitted kernel is the launcher run as a subprocess with `CUDA_VISIBLE_DEVICES` set to the GPUs
the service granted, on loopback ports chosen and held at submit (`ports.py`), so a requeued
kernel comes back at the same address. Groups are keyed by the whole kernel id; `groups`
holds each one and what its launcher's life means for it, `settings` the traits, the
inventory and where files go, `records.py` what each kernel left on disk. Every run and timer
is a task this backend owns until `aclose` (`tasks`).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir

from kernel_queue import errors, ids, wait_estimate
from kernel_queue.backends import feed, tasks
from kernel_queue.backends.local import (
    group_state,
    groups,
    launcher_process,
    machine_link,
    quota,
    records,
    settings,
    spare_launcher,
)
from kernel_queue.launcher import contract
from kernel_queue.machine import protocol
from kernel_queue.model import (
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    QueuePlace,
    StopCause,
    group_name,
    short_id,
)

Stage, Event, Action = group_state.Stage, group_state.Event, group_state.Action


class LocalBackend(settings.LocalSettings):
    """Queues kernels for this machine's GPUs, CPU and memory; runs them as local launchers.

    Configure it as `c.LocalBackend.<trait>` in a Jupyter server config file.
    """

    name = "local"
    tracks_kernel_restarts = True  # the launcher's status pipe reports every kernel process

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._groups: dict[str, groups.Group] = {}
        self._admissions = wait_estimate.Admissions()  # per queue: the estimate of a wait
        # kernel id -> its checkpoint store and the root it lies in, deleted at release
        self._checkpoints: dict[str, tuple[Path, Path]] = {}
        self._closed = False
        self._tasks = tasks.Tasks(self.log)  # each admitted kernel's run, its kill after grace
        self._machine = machine_link.MachineLink(self, self._tasks, self.log)
        self._ledger = records.Ledger(
            Path(jupyter_runtime_dir()) / "kernel-queue" / "kernels", self.log
        )
        self._spares = spare_launcher.Keeper(self.log)

    # -- ClusterBackend --------------------------------------------------------------------

    async def submit(self, spec: GroupSpec) -> GroupRef:
        """Queue the kernel (or return the ref of the one already queued or running).

        The group is keyed and named by the whole kernel id (a lowercase UUID, else refused);
        an id that another live server of this user runs is refused too (their log and
        checkpoint paths would be shared).
        """
        kernel_id = ids.check(spec.kernel_id)
        who = f"kernel {short_id(kernel_id)}"
        existing = self._groups.get(kernel_id)
        if existing is not None:
            return existing.ref
        self._check_open(who)
        await self.inventory()
        await self._machine.connect(self.machine_quota())  # refused here, nothing is held yet
        limits = self._machine.enforced() or self.local_quota()
        request = limits.request(spec)
        limits.check_fits(spec, request)
        checkpoints = self.checkpoint_dir(spec)
        if checkpoints is not None and not spec.checkpoint.path:
            await self.check_checkpoint_root(who)
        owned = None if checkpoints is None or spec.checkpoint.keep else checkpoints
        log_path = self.log_path(spec.name)
        self._ledger.reap_soon(self.reap_interval)
        other = await self._ledger.claim(
            kernel_id, log_path=log_path, checkpoints=owned, root=self.checkpoint_root_of(spec)
        )
        if other is not None:
            raise errors.LaunchFailed(
                f"{who}: another Jupyter server of this user (pid {other.server.pid}) runs a "
                f"kernel with the id {kernel_id}, and the two would share its log and "
                "checkpoints; start the kernel without choosing an id."
            )
        existing = self._groups.get(kernel_id)  # submitted again while this one waited
        if existing is not None:
            return existing.ref
        self._check_open(who)
        ports = groups.hold_ports(spec, self.log)
        connection = spec.connection.with_ports(ports.ports)
        ref = GroupRef(self.name, spec.name, kernel_id, connection)
        group = groups.Group(
            spec=replace(spec, connection=connection),
            ref=ref,
            request=request,
            status=GroupStatus(GroupPhase.QUEUED),
            log_path=log_path,
            ports=ports,
        )
        self._groups[kernel_id] = group
        if owned is not None:
            self._checkpoints[kernel_id] = (owned, self.checkpoint_root_of(spec))
        self.log.info("%s queued in %r needing %s", who, spec.queue, spec.needs())
        try:
            await self._machine.submit(group.submission(), self.machine_quota())
        except BaseException:
            await self.release(ref)
            raise
        return ref

    async def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        """The group's status, then each change, until it ends; a ref never seen is gone."""
        async for status in feed.follow(self._find(ref)):
            yield status

    async def stop(self, ref: GroupRef, *, grace: float, cause: StopCause) -> None:
        """Stop the kernel process; a waiting group leaves the queue. RESTART restarts in place."""
        group = self._find(ref)
        if group is None:
            return
        if cause is StopCause.RESTART:
            group.signal(signal.SIGHUP)  # the launcher restarts its kernel; the group stays
            return
        waited = group.stage in (Stage.QUEUED, Stage.PARKED)
        actions = group.step(Event.STOP)
        if Action.END in actions:  # no launcher: `_run` will not start one
            self._finish(
                group, 0, "removed from the queue" if waited else "stopped before it started"
            )
        if Action.STOP not in actions or group.process is None:
            return
        if cause is StopCause.KILL or grace <= 0:
            group.signal(signal.SIGKILL)
            return
        # Signal and return, as Popen.terminate does; the launcher is killed if it outlives grace.
        group.signal(signal.SIGTERM)
        kill_after = grace + contract.LOCAL_KILL_MARGIN_SECONDS
        self._tasks.spawn(groups.kill_after(group.process, kill_after), f"kill {group.spec.name}")

    async def park(self, ref: GroupRef, *, grace: float) -> None:
        """SIGTERM the launcher as a preemption does (the kernel saves, the launcher exits and
        is killed if it outlives `grace`); once it exited, its GPUs go to the next in line."""
        group = self._find(ref)
        if group is None or group.process is None or not group.step(Event.PARK):
            return  # only a running launcher parks
        self.log.info("%s parking: saving its variables", group.who)
        feed.publish(group, group.status.evolve(phase=GroupPhase.PARKING, message=""))
        group.note_stop("parked: the next cell brings it back")
        group.signal(signal.SIGTERM)
        kill_after = grace + contract.LOCAL_KILL_MARGIN_SECONDS
        self._tasks.spawn(groups.kill_after(group.process, kill_after), f"kill {group.spec.name}")

    async def resume(self, ref: GroupRef) -> None:
        """Requeue a parked group at the back of its queue; while parking, once parked."""
        group = self._find(ref)
        if group is not None and Action.WAKE in group.step(Event.RESUME):
            self.log.info("%s woken: back in %r", group.who, group.spec.queue)
            self._wake(group)

    async def send_signal(self, ref: GroupRef, signum: int) -> None:
        """Send `signum` to the launcher, which forwards it to the kernel."""
        group = self._find(ref)
        if group is not None:
            group.signal(signum)

    async def release(self, ref: GroupRef) -> None:
        """Stop the kernel if it runs, give back its quota and ports, remove its files.

        Whatever the group is doing (queued, starting, running, being preempted), it ends here
        and never starts again."""
        if not ids.is_valid(ref.kernel_id):
            return  # never submitted here: nothing of ours is named after it
        group = self._find(ref)
        if group is not None:
            ended = Action.END in group.step(Event.STOP)  # no launcher: it ends now
            if group.process is not None:
                await group.terminate(group.spec.grace_seconds)
            if ended or Action.END in group.step(Event.END):  # its launcher's exit not seen yet
                self._finish(group, 0, "removed from the queue")
        elif ref.kernel_id in self._groups:
            return  # a newer group of the same kernel owns the files now
        checkpoints, root = self._checkpoints.pop(ref.kernel_id, (None, None))
        await self._ledger.forget(
            ref.kernel_id,
            log_path=self.log_path(group_name(ref.kernel_id)),
            checkpoints=checkpoints,
            root=root,
        )

    async def aclose(self) -> None:
        """Release every group, then end every task this backend started and wait for its
        records; nothing is admitted or submitted afterwards."""
        self._closed = True
        await asyncio.gather(*(self.release(g.ref) for g in list(self._groups.values())))
        await self._tasks.aclose()
        await self._spares.aclose()
        await self._machine.aclose()
        await self._ledger.aclose()

    async def machine_queue(self) -> dict[str, Any]:
        """The machine's whole queue (`MachineLink.queue`), this server's kernels marked."""
        return await self._machine.queue(here=set(self._groups))

    def _find(self, ref: GroupRef) -> groups.Group | None:
        """The group `ref` names: same kernel id, same launch (a later one has other ports)."""
        group = self._groups.get(ref.kernel_id)
        return group if group is not None and group.ref == ref else None

    def _check_open(self, who: str) -> None:
        if self._closed:
            raise errors.LaunchFailed(f"{who}: the server is shutting down; start it again later")

    # -- the machine queue ------------------------------------------------------------------

    def _named(self, name: str) -> groups.Group | None:
        return next((g for g in self._groups.values() if g.spec.name == name), None)

    def _wake(self, group: groups.Group) -> None:
        """A parked group back at the end of its queue."""
        group.requeue()
        self._machine.resubmit(group.submission(), self.machine_quota())

    def held(self) -> list[tuple[protocol.Submit, tuple[str, ...] | None]]:
        """What to tell a machine service that restarted: the admitted groups with their GPUs
        (it takes their leases back), then the waiting ones in their order (queued again);
        parked groups wait for nothing."""
        admitted = [g for g in self._groups.values() if g.holds_admission]
        waiting = [g for g in self._groups.values() if g.waiting]
        waiting.sort(key=lambda g: g.place.position if g.place is not None else 0)
        return [(g.submission(), tuple(g.status.devices)) for g in admitted] + [
            (g.submission(), None) for g in waiting
        ]

    def placed(self, name: str, place: protocol.Position) -> None:
        """The service's word on a waiting group's place; for an admitted one, that its lease
        was reclaimed (its launcher outlived the grace of its preemption): it is killed."""
        group = self._named(name)
        if group is None:
            return
        group.place = QueuePlace(place.queue, place.position, place.length)
        group.why = place.reason  # a system service's per-user limit holds it back
        if group.holds_admission:
            if Action.KILL in group.step(Event.RECLAIM):  # only a launcher outlives its grace
                self.log.warning("%s: its GPUs were reclaimed after its grace; killed", group.who)
                group.signal(signal.SIGKILL)
            return
        self._show_place(group)

    def _show_place(self, group: groups.Group) -> None:
        place = group.place
        if group.waiting and place is not None:
            wait = self._admissions.estimate(place.queue, now=time.time(), position=place.position)
            feed.publish(group, group.queued_status(wait))

    def admitted(self, name: str, devices: tuple[str, ...]) -> None:
        """The service admitted the group on `devices`: start its launcher."""
        group = self._named(name)
        if group is None or self._closed or Action.START not in group.step(Event.ADMIT):
            return
        group.place = None
        self._admissions.observe(group.spec.queue, (group.spec.name, time.monotonic()), time.time())
        feed.publish(group, GroupStatus(GroupPhase.ADMITTED, flavor=quota.FLAVOR, devices=devices))
        self.log.info("kernel %s admitted with GPUs %s", short_id(group.spec.kernel_id), devices)
        group.task = self._tasks.spawn(self._run(group), f"run {group.spec.name}")

    def preempted(self, name: str, message: str) -> None:
        """The service asks the group to give back its GPUs: SIGTERM (the kernel saves)."""
        group = self._named(name)
        if group is None:
            return
        actions = group.step(Event.PREEMPT)
        if Action.SAY_EVICTED not in actions:
            return  # not admitted, or already giving its GPUs back (parking), or ending
        self.log.info("%s %s", group.who, message)
        feed.publish(group, group.status.evolve(phase=GroupPhase.EVICTED, message=message))
        if Action.REQUEUE in actions:
            self._requeue(group)  # admitted, not started yet
            return
        group.note_stop(message)
        group.signal(signal.SIGTERM)

    def lost(self, name: str, message: str) -> None:
        """The service refused the group, or its lease ended with the connection: it ends."""
        group = self._named(name)
        if group is None:
            return
        self.log.warning("%s: %s", group.who, message)  # its failure is logged where it ends
        actions = group.step(Event.LEASE_LOST)
        if Action.END in actions:  # no launcher
            self._finish(group, None, message, failed=True)
        elif Action.KILL in actions:
            group.lease_lost = message
            group.signal(signal.SIGKILL)

    def _requeue(self, group: groups.Group) -> None:
        """The preempted group's launcher is gone: its GPUs back, at the end of its queue."""
        group.requeue()
        self._machine.requeue(group.spec.name)
        self._show_place(group)

    # -- processes -------------------------------------------------------------------------

    async def _run(self, group: groups.Group) -> None:
        """Start the group's launcher and settle the group when it exits."""
        spec = group.spec
        planted = await asyncio.to_thread(settings.planted_problem, self.checkpoint_dir(spec))
        if group.stage is not Stage.ADMITTED:
            return  # stopped, released, lost or preempted (requeued) meanwhile
        if planted is not None:
            verb = "resume" if group.launches else "start"
            group.step(Event.END)
            self._finish(group, None, f"{group.who} cannot {verb}: {planted}", failed=True)
            return
        # A resumed kernel's ports were free while it was down: it may have lost one.
        taken = group.ports.hold()
        if taken:
            group.step(Event.END)
            self._finish(group, None, group.cannot_listen(taken), failed=True)
            return
        group.ports.lend()  # from here to the launcher's exit the kernel listens there
        group.launches += 1
        request = group.launch_request(self.checkpoint_dir(spec))

        def started(pid: int) -> None:
            self._ledger.launcher_started(spec.kernel_id, pid)

        group.process = launcher_process.LauncherProcess(
            lambda event: group.on_launcher_event(event, started=started, log=self.log)
        )
        group.step(Event.LAUNCH)
        spare = self._spares.take(request.env)
        if self.spare_launcher:  # for the next launch, once this one is under way
            self._spares.prepare(request.env, request.log_path.parent)
        try:
            code = await group.process.run(request, spare)
        except OSError as exc:
            group.process = None
            if Action.END in group.step(Event.END):
                message = f"could not start the kernel launcher: {exc}"
                self._finish(group, None, message, failed=True)
            return
        group.process = None
        lost = group.launcher_lost(code)
        if lost and Action.BURY in group.step(Event.LAUNCHER_LOST):
            await self._interrupted(group, lost)
            return
        self._on_exit(group, code)

    async def _interrupted(self, group: groups.Group, why: str) -> None:
        """A lost launcher is a pause: its kernel went with it, so the group goes back to its
        queue (its GPUs freed, its ports held) and comes back from its last checkpoint; one
        lost too often in a minute ends (`Group.lost_too_often`)."""
        await group.bury_kernel()
        if group.stage is not Stage.INTERRUPTED:
            return  # stopped, released or its lease lost meanwhile: it ended
        if group.lost_too_often(time.monotonic()):
            group.step(Event.END)
            message = (
                f"it stopped without warning {len(group.losses)} times within a minute, the "
                f"last time because {why}; it is not brought back again: start it again, and "
                "look at its log"
            )
            self._finish(
                group, None, message + launcher_process.log_tail(group.log_path), failed=True
            )
            return
        self.log.warning(
            "%s stopped without warning (%s); queued again to come back from its last checkpoint",
            group.who,
            why,
        )
        group.step(Event.BURIED)
        group.interrupted(why)
        self._machine.requeue(group.spec.name)
        feed.publish(group, group.status)
        self._show_place(group)

    def _on_exit(self, group: groups.Group, code: int) -> None:
        """Its launcher exited: parked, requeued, or the end, as its stage says."""
        if group.stage is Stage.LOST:
            message, failed = group.lease_lost, True
        else:
            message, failed = group.exit_message(code)  # read before the stage moves on
        actions = group.step(Event.EXITED)
        if Action.PARKED in actions:
            self.log.info("%s parked: %s", group.who, group.saved or "nothing saved")
            group.park()
            self._machine.release(group.spec.name)  # its GPUs go to the next in line
            if Action.WAKE in actions:  # a resume came while it parked
                self._wake(group)
        elif Action.REQUEUE in actions:
            self.log.info("%s stopped after preemption; requeued", group.who)
            self._requeue(group)
        elif Action.END in actions:
            self._finish(group, code, message, failed=failed)

    def _finish(
        self, group: groups.Group, code: int | None, message: str, *, failed: bool = False
    ) -> None:
        """End the group, now ENDED (its step said END): free its quota, tell watchers, forget
        it, admit the next."""
        phase = GroupPhase.FAILED if failed else GroupPhase.FINISHED
        if self._groups.get(group.spec.kernel_id) is group:
            del self._groups[group.spec.kernel_id]
        group.ports.close()
        feed.publish(group, GroupStatus(phase, message=message, exit_code=code))
        self._machine.release(group.spec.name)  # its place or GPUs go to the next in line
