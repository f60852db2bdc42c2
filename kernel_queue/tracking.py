"""Follow one kernel's group: feed backend observations through the lifecycle, and wait on it.

A `KernelTracker` follows one submission of a kernel for its session (`session.py`): it consumes
the backend's `watch` stream in one task, keeps the last status and lifecycle in memory (so
`poll()` never calls a backend), carries out the lifecycle's actions, sees a restart in place
end (a newer kernel generation, or the heartbeat back) and lets the session wait for "live" or
"gone" without sleeping: every change sets an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable
from typing import Protocol

from kernel_queue import errors, heartbeat, kernel_info, lifecycle
from kernel_queue.backends import ClusterBackend
from kernel_queue.lifecycle import IN_PLACE, LIVE, Action, Command, KernelState, Lifecycle
from kernel_queue.model import ConnectionInfo, GroupPhase, GroupRef, GroupStatus, short_id

Notify = Callable[[Lifecycle, GroupStatus], None]
log = logging.getLogger(__name__)


class Probe(Protocol):
    """How the tracker asks whether a kernel serves: over ZeroMQ (`ZMQ`) unless the backend
    brings its own as a `probe` attribute (`backends.fake.FakeBackend` does, for tests)."""

    async def answers(self, connection: ConnectionInfo, address: str) -> None:
        """Return once a kernel at `address` answers kernel_info; runs until cancelled."""
        ...

    async def heartbeat(self, address: str, port: int, *, alive: bool, within: float) -> bool:
        """Wait until the heartbeat answers (`alive`) or stops; False if `within` passed."""
        ...


class _ZmqProbe:
    async def answers(self, connection: ConnectionInfo, address: str) -> None:
        await kernel_info.answers(connection, address)

    async def heartbeat(self, address: str, port: int, *, alive: bool, within: float) -> bool:
        return await heartbeat.wait_for(address, port, alive=alive, within=within)


ZMQ: Probe = _ZmqProbe()


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


class KernelTracker:
    """The in-memory view of one submitted group, shared by the provisioner's hooks."""

    def __init__(
        self,
        backend: ClusterBackend,
        ref: GroupRef,
        *,
        queue: str,
        notify: Notify,
    ) -> None:
        self.backend = backend
        self.probe: Probe = getattr(backend, "probe", None) or ZMQ
        self.ref = ref
        self.queue = queue
        self.lifecycle = Lifecycle()
        self.status = GroupStatus(GroupPhase.PENDING)
        self.failure: errors.KernelQueueError | None = None
        self._release: asyncio.Task[None] | None = None
        self.released = False  # the backend's release of this group completed
        self.waited = 0.0  # seconds the latest launch spent before the kernel was live
        self.waiting_since: datetime.datetime | None = None  # start of the current queue wait
        self._notify = notify
        self._changed = asyncio.Event()
        self.observed = asyncio.Event()  # set once the backend reported a first status
        self._task: asyncio.Task[None] | None = None
        self._answer: asyncio.Task[None] | None = None  # waits for the kernel's first answer
        self.restart_generation = 0  # the kernel process generation a restart in place replaces
        self._restart_within = 0.0  # how long a restart in place may take (for its failure)

    # -- following ---------------------------------------------------------------------------

    def start(self) -> None:
        """Begin consuming the backend's watch stream (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        try:
            async for status in self.backend.watch(self.ref):
                self.status = status
                if status.phase is GroupPhase.RUNNING and self.lifecycle.state not in IN_PLACE:
                    self._await_answer()  # "running" or "resumed" once the kernel answers
                else:
                    self._stop_waiting_for_answer()
                    await self.observe(status.phase)
                if self.lifecycle.state is KernelState.RESTARTING and self._restart_done():
                    await self.observe(Command.RESTARTED)  # the backend saw the new process
                self.observed.set()
        finally:
            self._stop_waiting_for_answer()

    def _await_answer(self) -> None:
        """Observe RUNNING once the kernel at the current address answers kernel_info."""
        if self._answer is None or self._answer.done():
            self._answer = asyncio.get_running_loop().create_task(self._answered())

    async def _answered(self) -> None:
        await self.probe.answers(self.ref.connection, self.address)
        if self.status.phase is GroupPhase.RUNNING:
            await self.observe(GroupPhase.RUNNING)

    def _stop_waiting_for_answer(self) -> None:
        if self._answer is not None:
            self._answer.cancel()
            self._answer = None

    async def observe(self, observed: lifecycle.Observation) -> None:
        """Apply one observation and carry out the resulting actions."""
        actions = self._apply(observed)
        if Action.RELEASE in actions:
            try:
                await self.release()
            except Exception as exc:  # the launch still fails with its own cause
                log.warning("kernel %s: its release failed: %s", short_id(self.ref.kernel_id), exc)

    def restart(self) -> None:
        """A restart in place was asked for: a live kernel is RESTARTING until the process
        after the current one runs (synchronous, so a poll right after sees it)."""
        self.restart_generation = self.status.generation
        self._apply(Command.RESTART)

    def _restart_done(self) -> bool:
        """The backend reports a kernel process newer than the one a restart replaces."""
        status = self.status
        return status.kernel_alive and status.generation > self.restart_generation

    def _apply(self, observed: lifecycle.Observation) -> frozenset[Action]:
        before = self.lifecycle.state
        transition = lifecycle.step(self.lifecycle, observed)
        if transition.lifecycle.state not in lifecycle.WAITING:
            self.waiting_since = None
        elif self.waiting_since is None:  # a wait begins; position changes keep its start
            self.waiting_since = datetime.datetime.now(datetime.UTC)
        self.lifecycle = transition.lifecycle
        actions = transition.actions
        if Action.FAIL in actions and self.failure is None:
            self.failure = self._failure_for(observed, before)
        # Every status may change what the user reads (a position, what a checkpoint saved);
        # the session tells the user only when the sentence changes.
        self._notify(self.lifecycle, self.status)
        self._changed.set()
        return actions

    async def release(self) -> None:
        """Give the group back to the backend until that succeeds once: every caller (the
        lifecycle, a shutdown) waits for the same release, which runs to the end even if a
        caller is cancelled (as the follower is by `aclose`), so nothing is left half-deleted.
        A release that failed raises to its callers, and the next call runs it again."""
        if self.released:
            return
        task = self._release
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.get_running_loop().create_task(self.backend.release(self.ref))
            task.add_done_callback(_retrieved)  # read even when every waiter was cancelled
            self._release = task
        await asyncio.shield(task)
        self.released = True

    @property
    def address(self) -> str:
        """Where the kernel is reached: its pod's IP (`connect = "pod-ip"`) or the group's."""
        return self.status.address or self.ref.connection.ip

    async def wait_heartbeat(self, *, alive: bool, within: float) -> bool:
        """Wait until the kernel's heartbeat answers (`alive`) or stops; False if `within`
        passed. For backends that cannot see the kernel process restart (pods)."""
        port = self.ref.connection.hb_port
        return await self.probe.heartbeat(self.address, port, alive=alive, within=within)

    async def wait_back(self, *, within: float) -> None:
        """After an in-place restart: return once the new kernel answers its heartbeat (for
        backends that cannot see kernel processes), else fail the kernel (StartupTimeout)."""
        self._restart_within = within
        if await self.wait_heartbeat(alive=True, within=within):
            await self.observe(Command.RESTARTED)
            return
        await self._restart_failed()

    async def _restart_failed(self) -> None:
        await self.observe(Command.STARTUP_TIMEOUT)
        if self.failure is not None and self.lifecycle.state is KernelState.FAILED:
            raise self.failure
        raise self._restart_timeout()

    def _restart_timeout(self) -> errors.StartupTimeout:
        after = "" if self.backend.tracks_kernel_restarts else "; see its pod's log"
        return errors.StartupTimeout(
            f"kernel {short_id(self.ref.kernel_id)} did not come back within "
            f"{self._restart_within:.0f} s of a restart{after}"
        )

    def describe(self, *, needs: str, restored: bool, parked: str = "", gpus: int = 0) -> str:
        """The sentence the user reads now: the failure, once failed; else the lifecycle's."""
        if self.failure is not None and self.lifecycle.state is KernelState.FAILED:
            return str(self.failure)
        return lifecycle.describe(
            self.lifecycle,
            self.status,
            queue=self.queue,
            needs=needs,
            restored=restored,
            parked=parked,
            gpus=gpus,
        )

    def _failure_for(
        self, observed: lifecycle.Observation, before: KernelState
    ) -> errors.KernelQueueError:
        who = f"kernel {short_id(self.ref.kernel_id)}"
        if observed is Command.STARTUP_TIMEOUT and before is KernelState.RESTARTING:
            return self._restart_timeout()
        if observed is Command.CANCEL:
            return errors.LaunchCancelled(f"{who} was shut down while waiting in '{self.queue}'")
        if observed is Command.ADMISSION_TIMEOUT:
            return errors.AdmissionTimeout(
                f"{who} waited {self.waited:.0f} s in '{self.queue}' without being admitted "
                "(admission_timeout); it was removed from the queue. Try again later, ask for "
                "fewer GPUs, or raise `admission_timeout` in the kernelspec (0 waits forever)."
            )
        if observed is Command.STARTUP_TIMEOUT:
            why = f" ({self.status.message})" if self.status.message else ""
            return errors.StartupTimeout(
                f"{who} was admitted but its kernel did not start within startup_timeout{why}; "
                "see the kernel's log, or raise `startup_timeout` in the kernelspec."
            )
        if self.status.never_fits:  # the backend's queue could never admit what it asks for
            return errors.NeverFits(f"{who} {self.status.message}", has=self.status.has)
        return errors.LaunchFailed(f"{who} failed: {self.status.message or 'the kernel ended'}")

    async def aclose(self) -> None:
        """Stop following the group."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- waiting ---------------------------------------------------------------------------

    @property
    def waiting(self) -> bool:
        """True while the kernel waits for (re-)admission."""
        return self.lifecycle.state in lifecycle.WAITING

    async def wait_live(self, *, admission_timeout: float, startup_timeout: float) -> None:
        """Return once the kernel can be reached; raise the lifecycle's failure otherwise.

        `admission_timeout` (0 = forever) bounds the time in the queue; `startup_timeout` the
        time from admission to a running kernel. Both end the wait through the lifecycle.
        """
        started = time.monotonic()
        admitted_at: float | None = None
        while True:
            self._changed.clear()
            state = self.lifecycle.state
            if self.failure is not None:
                raise self.failure
            if state in lifecycle.LIVE:
                self.waited = time.monotonic() - started
                return
            if state in lifecycle.TERMINAL:
                raise errors.LaunchFailed(
                    f"kernel {short_id(self.ref.kernel_id)} ended while starting"
                )
            now = time.monotonic()
            timeout: float | None = None
            command = Command.ADMISSION_TIMEOUT
            if state in (KernelState.ADMITTED, KernelState.RESTARTING):
                admitted_at = admitted_at or now
                timeout, command = admitted_at + startup_timeout - now, Command.STARTUP_TIMEOUT
            else:
                admitted_at = None  # back in the queue: a later admission starts a new clock
                if admission_timeout > 0:
                    timeout = started + admission_timeout - now
            try:  # not asyncio.wait_for: in 3.11 it lost a cancel that came with a change
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
            except TimeoutError:
                self.waited = time.monotonic() - started
                await self.observe(command)

    async def wait_restarted(self, *, within: float) -> None:
        """Return once a kernel process newer than the one a restart replaces runs (a backend
        that reports kernel processes), or once the kernel left its admission (preempted or
        ended meanwhile: the caller's `wait_live` takes over); else fail it (StartupTimeout)."""
        self._restart_within = within
        try:
            async with asyncio.timeout(within):
                while not (self.lifecycle.state in LIVE and self._restart_done()):
                    if self.lifecycle.state not in IN_PLACE:
                        return
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            await self._restart_failed()

    async def wait_changed(self) -> None:
        """Return at the next change of status or lifecycle."""
        self._changed.clear()
        await self._changed.wait()
