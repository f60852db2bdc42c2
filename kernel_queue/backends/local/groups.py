"""One kernel of the local backend: its record, and what its launcher's life means for it.

`Group` is what `LocalBackend` keeps of each kernel: its spec, queue request and admission, its
held ports and its launcher. Its methods do what needs no view of the other kernels: signal and
terminate the launcher, render the launcher's inputs, turn the launcher's events into statuses
(a kernel process started or exited, a checkpoint saved), put a preempted kernel back in line,
and say in a sentence why a launcher's exit or a lost port ends the kernel. Queueing, admission
and preemption, which weigh the kernels against each other, stay in `local`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_queue import admission
from kernel_queue.backends import feed
from kernel_queue.backends.local import group_state, launcher_process
from kernel_queue.backends.local import ports as held_ports
from kernel_queue.launcher import contract
from kernel_queue.machine import protocol
from kernel_queue.model import (
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    QueuePlace,
    Waiting,
    short_id,
)

MAX_LOSSES = 3
"""Lost launchers of one kernel within `LOSS_WINDOW_SECONDS` that are brought back."""
LOSS_WINDOW_SECONDS = 60.0


@dataclass(eq=False)
class Group:
    """One submitted kernel as the local backend tracks it."""

    spec: GroupSpec
    ref: GroupRef
    request: admission.Request
    status: GroupStatus
    log_path: Path
    ports: held_ports.HeldPorts
    watchers: set[asyncio.Queue[GroupStatus]] = field(default_factory=set)
    state: group_state.State = field(default_factory=group_state.State)  # moved by `step`
    process: launcher_process.LauncherProcess | None = None
    task: asyncio.Task[None] | None = None
    saved: str = ""  # what the last preemption's checkpoint saved, as the kernel reported it
    launches: int = 0  # launchers started so far (a later one resumes the kernel)
    place: QueuePlace | None = None  # its place in line, as the machine's queue last said
    why: str = ""  # why it waits though GPUs may be free, as the machine's queue said
    lease_lost: str = ""  # LOST: why the machine's queue ended its lease (its end's message)
    kernel_pid: int | None = None  # the kernel process its launcher started last
    interruption: str = ""  # waiting again because its launcher was lost: why (`interrupted`)
    kernel_status: int | None = None  # the last kernel process's exit status, as its launcher said
    losses: list[float] = field(default_factory=list)  # when its launchers were lost (monotonic)

    def step(self, event: group_state.Event) -> frozenset[group_state.Action]:
        """Move the group's state (`group_state.step`); the actions are the caller's to do."""
        moved = group_state.step(self.state, event)
        self.state = moved.state
        return moved.actions

    @property
    def stage(self) -> group_state.Stage:
        return self.state.stage

    @property
    def leaving(self) -> bool:
        """Its launcher was asked to give back its admission (preempted or parking): its
        kernel's start and exit are no news."""
        return self.state.leaving

    @property
    def holds_admission(self) -> bool:
        """Admitted: the machine's queue counts its GPUs as this group's."""
        return self.state.stage in group_state.HOLDING

    @property
    def waiting(self) -> bool:
        """In the queue: not admitted, not parked, not ended."""
        return self.state.stage is group_state.Stage.QUEUED

    @property
    def who(self) -> str:
        """ "kernel 1a2b3c4d", as sentences name it."""
        return f"kernel {short_id(self.spec.kernel_id)}"

    def submission(self) -> protocol.Submit:
        """What the machine's queue needs of the group; its GPUs are reclaimed at the same
        deadline the backend kills an unanswering launcher by."""
        spec = self.spec
        return protocol.Submit(
            group=spec.name,
            kernel_id=spec.kernel_id,
            queue=spec.queue,
            priority=self.request.priority,
            resources=dict(self.request.resources),
            grace=spec.grace_seconds + contract.LOCAL_KILL_MARGIN_SECONDS,
            priority_class=spec.priority_class,
            needs=spec.needs(),
        )

    def queued_status(self, wait: float | None) -> GroupStatus:
        """Waiting at `place`, an estimate of the wait if there is one, what it saved."""
        return GroupStatus(
            GroupPhase.QUEUED,
            place=self.place,
            message=self.saved,
            waiting=Waiting(why=self.why, estimate=wait) if wait is not None or self.why else None,
            interrupted=self.interruption,
        )

    def signal(self, signum: int) -> None:
        """Send `signum` to the launcher, if one runs."""
        if self.process is not None:
            self.process.signal(signum)

    async def terminate(self, grace: float) -> None:
        """SIGTERM the launcher (it stops the kernel), SIGKILL it if it outlives `grace`."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM if grace > 0 else signal.SIGKILL)
        process = self.process
        try:
            kill_after = max(grace, 0) + contract.LOCAL_KILL_MARGIN_SECONDS
            async with asyncio.timeout(kill_after):
                await process.exited.wait()
        except TimeoutError:
            process.signal(signal.SIGKILL)
            await process.exited.wait()

    def launch_request(self, checkpoint_dir: Path | None) -> launcher_process.LaunchRequest:
        """How to start the kernel's launcher: its ports, key and checkpoint store. Its stop
        timeout is the whole grace period (this backend kills the launcher only after it)."""
        spec, connection = self.spec, self.ref.connection
        launch = contract.Launch(
            grace_seconds=spec.grace_seconds,
            pod=False,
            ports=connection.ports,
            ip=connection.ip,
            key=connection.key,
            transport=connection.transport,
            signature_scheme=connection.signature_scheme,
            parent_death=True,
            checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
            keep_checkpoints=spec.checkpoint.keep,
            continuous_checkpoints=spec.checkpoint.continuous,
            stop_note=str(self.stop_note_path),
        )
        with contextlib.suppress(OSError):
            self.stop_note_path.unlink()  # an earlier launcher's, never read
        return launcher_process.LaunchRequest(
            kernel_id=spec.kernel_id,
            argv=spec.argv,
            env=spec.env,
            cwd=spec.cwd,
            launch=launch,
            devices=self.status.devices,
            log_path=self.log_path,
        )

    def on_launcher_event(
        self,
        event: dict[str, Any],
        *,
        started: Callable[[int], None],
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        """A status line of the launcher: a kernel process started (`started(launcher pid)`
        records the launcher) or exited, or a checkpoint was saved."""
        if event.get("event") == "checkpoint":
            self.saved = str(event.get("summary") or "")
            log.info("%s: %s", self.who, self.saved)
            return
        status = self.status
        if event.get("event") == "started" and self.process is not None and self.process.pid:
            started(self.process.pid)
        if event.get("event") == "started" and isinstance(event.get("pid"), int):
            self.kernel_pid = int(event["pid"])
        if event.get("event") == "started" and not self.leaving:
            self.saved = ""
            feed.publish(
                self,
                status.evolve(
                    phase=GroupPhase.RUNNING,
                    message="",
                    generation=int(event.get("generation", 0)),
                    kernel_alive=True,
                ),
            )
        elif event.get("event") == "exited" and not self.leaving:
            feed.publish(self, status.evolve(kernel_alive=False))
        if event.get("event") == "exited" and isinstance(event.get("status"), int):
            self.kernel_status = int(event["status"])

    def requeue(self) -> None:
        """Back in the queue after its preemption's launcher exited (or woken from parked): no
        admission, its ports held again while it waits (a port lost now is retried at
        admission); the machine's queue service puts it at the back of the line."""
        self.interruption = ""
        self.ports.hold()
        self.status = GroupStatus(GroupPhase.QUEUED, message=self.saved)

    def park(self) -> None:
        """Its launcher exited after parking: no admission, out of the queue, its ports held
        (it comes back at the same address), what it saved reported."""
        self.ports.hold()
        feed.publish(self, GroupStatus(GroupPhase.PARKED, message=self.saved))

    def launcher_lost(self, code: int) -> str:
        """Why the launcher is gone though nobody of ours stopped it (a signal killed it: the
        OOM killer's SIGKILL, a crash, someone's kill) after its kernel ran, in words; "" when
        its exit is the kernel's own end (a shutdown, a kernel that exited by itself)."""
        if self.state.stage is not group_state.Stage.RUNNING or code < 128:
            return ""  # stopped, preempted, parking or lost: by us or by the machine's queue
        if self.status.generation == 0 and not self.status.kernel_alive and self.kernel_pid is None:
            return ""  # it never ran a kernel: an exit before the start, said as such
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        if self.kernel_status == code:  # the launcher passed on its kernel's death
            return f"the kernel process was killed by {name}"
        return f"its launcher was killed by {name} (exit {code})"

    @property
    def stop_note_path(self) -> Path:
        """Where the next SIGTERM's reason goes for the kernel's notice (beside its log)."""
        return self.log_path.with_name(self.log_path.name + ".stop")

    def note_stop(self, why: str) -> None:
        """Tell the kernel why the SIGTERM that follows comes (its notice says it)."""
        with contextlib.suppress(OSError):  # the notice then says it cannot tell
            contract.write_stop_note(str(self.stop_note_path), why)

    def lost_too_often(self, now: float) -> bool:
        """A kernel that stops without warning again and again (a restore that crashes it, a
        machine that keeps killing it) is not brought back a fourth time within a minute."""
        self.losses = [t for t in self.losses if now - t < LOSS_WINDOW_SECONDS] + [now]
        return len(self.losses) > MAX_LOSSES

    async def bury_kernel(self, within: float = 5.0) -> None:
        """Make sure the lost launcher's kernel (its own session, killed with its parent) is
        gone, so its ports are free for the kernel that replaces it (bounded)."""
        pid = self.kernel_pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while loop.time() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                return
            await asyncio.sleep(0.02)

    def interrupted(self, why: str) -> None:
        """The launcher is lost (`launcher_lost`): back in its queue, its ports held, to come
        back from its last checkpoint; watchers read why it stopped."""
        self.kernel_pid, self.interruption = None, why
        self.kernel_status = None
        self.ports.hold()
        self.status = GroupStatus(GroupPhase.QUEUED, interrupted=why)

    def exit_message(self, code: int) -> tuple[str, bool]:
        """Why the kernel ends now that its launcher exited with `code`, and whether that is a
        failure: a port taken while it ran, an exit before the kernel started, or its end."""
        stopped = self.state.stage is not group_state.Stage.RUNNING  # ENDING: stopped by us
        if not stopped:  # the kernel ended on its own: did someone take a port?
            taken = self.ports.hold()
            if taken:
                ports, verb = self.ports.describe(taken), "is" if len(taken) == 1 else "are"
                message = (
                    f"the kernel exited with code {code}: {ports} {verb} taken by another "
                    "process, so the kernel could not listen there; start the kernel again and "
                    "it gets new ports"
                )
                return message + launcher_process.log_tail(self.log_path), True
        if not stopped and self.status.phase is GroupPhase.ADMITTED:
            message = f"the kernel exited with code {code} before it started"
            return message + launcher_process.log_tail(self.log_path), True
        return f"the kernel exited with code {code}", False

    def cannot_listen(self, taken: list[int]) -> str:
        """Why the kernel cannot start or resume: `taken` of its ports are another process's."""
        ports, verb = self.ports.describe(taken), "is" if len(taken) == 1 else "are"
        if self.launches:
            return (
                f"{self.who} cannot resume: {ports}, where its clients reconnect, {verb} taken "
                "by another process; start the kernel again and it gets new ports"
            )
        return (
            f"{self.who} cannot start: {ports} {verb} taken by another process; start the "
            "kernel again and it gets new ports"
        )


def hold_ports(
    spec: GroupSpec, log: logging.Logger | logging.LoggerAdapter[Any]
) -> held_ports.HeldPorts:
    """Choose and hold the kernel's five ports while it waits (so a requeued kernel comes back
    at the same address); out of file descriptors, only choose them (checked at admission)."""
    ip = spec.connection.ip
    try:
        return held_ports.HeldPorts.new(ip)
    except OSError as exc:
        log.warning(
            "kernel %s: cannot hold its ports while it waits (%s); another process may take them",
            short_id(spec.kernel_id),
            exc,
        )
        return held_ports.HeldPorts(ip, tuple(launcher_process.free_ports(ip, 5)))


async def kill_after(process: launcher_process.LauncherProcess, seconds: float) -> None:
    """SIGKILL the launcher if it still runs `seconds` from now."""
    try:
        async with asyncio.timeout(seconds):
            await process.exited.wait()
    except TimeoutError:
        process.signal(signal.SIGKILL)
