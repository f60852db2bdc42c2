"""`KernelSession`: one kernel as a front end sees it, under the provisioner and the EG proxy.

It holds the kernel's backend lease and its current submission (a `tracking.KernelTracker`) and
owns what both front ends do alike: launch and wait, a restart in place, `poll`'s answer, the
grace of a stop, the release, and the sentence the user reads (told only when it changes).
`provisioner.py` and `gateway/proxy.py` translate their hooks into these calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kernel_queue import backends, errors, events, lifecycle, spec, tracking
from kernel_queue.backends import BackendLease
from kernel_queue.lifecycle import IN_PLACE, LIVE, TERMINAL, KernelState, Lifecycle
from kernel_queue.model import (
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    Noted,
    StopCause,
    short_id,
)

Tell = Callable[[KernelState, str], None]
"""Tell the user a new sentence; the state as users see it (`lifecycle.shown`)."""
Touch = Callable[[], None]
"""Refresh the kernel's `last_activity`, so the culler leaves a waiting kernel alone."""

OLD_KERNEL_SECONDS = 10.0
"""How long a restart waits for the old kernel to stop answering (a kernel that ignores its
`shutdown_request` is then stopped by jupyter as usual)."""


class KernelSession:
    """One kernel from its first launch to its final release, across its submissions."""

    def __init__(
        self,
        lease: BackendLease,
        *,
        kernel_id: str,
        log: Any,
        tell: Tell,
        touch: Touch,
        spec: GroupSpec | None = None,
    ) -> None:
        self.lease = lease
        self.kernel_id = kernel_id
        self.spec = spec  # the latest group submitted (or to submit); None for one adopted
        self.log = log
        self.tracker: tracking.KernelTracker | None = None
        self.tell, self.touch = tell, touch
        self._told: str | None = None
        self._restart = False  # a restart was asked for; the launch after it has not ended
        self._old_gone = False  # and the old kernel stopped answering its heartbeat
        self._parked_why = ""  # "after 30 min idle", "on request": the latest park's reason
        self._parked_since: datetime.datetime | None = None
        self._ended: dict[str, Any] | None = None  # the failed launch's last queue status
        self._noted: Noted | None = None  # what a front end kept of an adopted kernel
        self._launching = False  # inside `launch`, from its first step to its end
        self._cancelled = False  # a cancel came before the launch's group could be cancelled

    @property
    def backend(self) -> backends.ClusterBackend:
        return self.lease.backend

    def attach(self, tell: Tell, touch: Touch) -> None:
        """Tell another front end from now on (EG makes a new proxy for a restart)."""
        self.tell, self.touch = tell, touch

    # -- following a group -------------------------------------------------------------------

    async def submit(self, group: GroupSpec) -> tracking.KernelTracker:
        """Queue `group` and follow it (the previous submission is no longer followed)."""
        if self.tracker is not None:
            await self.tracker.aclose()
        self.spec = group
        ref = await self.backend.submit(group)
        return self.adopt(ref, queue=group.queue)

    def adopt(self, ref: GroupRef, *, queue: str) -> tracking.KernelTracker:
        """Follow a group submitted before (by this server before it restarted, say)."""
        self.tracker = tracking.KernelTracker(self.backend, ref, queue=queue, notify=self._changed)
        self.tracker.start()
        return self.tracker

    async def reattach(self, ref: GroupRef, *, queue: str, within: float) -> None:
        """Adopt `ref` and wait (at most `within` s) for the backend to say where it stands,
        so that `poll` answers the truth right after."""
        tracker = self.adopt(ref, queue=queue)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await tracker.observed.wait()
        if tracker.lifecycle.state in TERMINAL:
            self.log.warning("kernel %s: its group %s is gone", short_id(ref.kernel_id), ref.name)

    async def launch(
        self, group: GroupSpec | None, *, admission_timeout: float, startup_timeout: float
    ) -> tracking.KernelTracker:
        """Return once the kernel can be reached: a kernel restarting in place waits for its
        new process; one never submitted, or whose group ended, has `group` (else the last
        one) submitted; then wait for it to run. A failed launch releases the group (a
        release that fails is logged; the launch's own error is raised)."""
        self._launching = True
        try:
            return await self._launch(
                group, admission_timeout=admission_timeout, startup_timeout=startup_timeout
            )
        finally:
            self._launching = self._cancelled = False

    async def _launch(
        self, group: GroupSpec | None, *, admission_timeout: float, startup_timeout: float
    ) -> tracking.KernelTracker:
        tracker = self.tracker
        if tracker is not None and self.parked:  # a restart of a parked kernel wakes it
            await self.resume()
        if tracker is not None and tracker.lifecycle.state in IN_PLACE:
            if self.backend.tracks_kernel_restarts:
                await tracker.wait_restarted(within=startup_timeout)
            else:
                await tracker.wait_back(within=startup_timeout)
        try:
            if tracker is None or tracker.lifecycle.state in TERMINAL:
                self._ended = None
                group = group or self.spec
                if group is None:  # adopted after a restart, then ended: nothing to submit
                    raise errors.LaunchFailed(f"kernel {short_id(self.kernel_id)} has ended")
                if self._cancelled:  # shut down before its group was even submitted
                    raise errors.LaunchCancelled(
                        f"kernel {short_id(self.kernel_id)} was shut down before it was queued"
                    )
                tracker = await self.submit(group)
                if self._cancelled:  # shut down while the submission was on its way
                    await tracker.observe(lifecycle.Command.CANCEL)
            await tracker.wait_live(
                admission_timeout=admission_timeout, startup_timeout=startup_timeout
            )
        except BaseException as exc:
            if isinstance(exc, Exception):
                self._launch_failed(exc)
            try:
                await self.release()
            except Exception as exc:  # the launch's own failure is the one the user reads
                self.log.warning("kernel %s: release failed: %s", short_id(self.kernel_id), exc)
            raise
        self._restart = False
        return tracker

    def _launch_failed(self, error: Exception) -> None:
        """Keep the failed launch's last queue status (listed until the kernel is shut down);
        where the lifecycle did not tell it (the backend refused the submission), tell it."""
        tracker = self.tracker
        if tracker is not None and tracker.lifecycle.state in TERMINAL:
            self._ended = self.queue_status()  # told already, as it happened
        elif self.spec is not None:
            seen = (tracker.lifecycle, tracker.status) if tracker else None
            self._ended = events.failed_payload(self.spec, self.lease.name, error, seen)
            self._told = str(error)
            self.tell(KernelState.FAILED, self._told)

    def connection(self) -> dict[str, Any]:
        """The running kernel's connection info, at the address it is reached at now."""
        assert self.tracker is not None
        info = self.tracker.ref.connection.to_dict()
        info["ip"] = self.tracker.address
        return info

    # -- a restart in place --------------------------------------------------------------------

    def shutdown_requested(self, restart: bool) -> bool:
        """The front end sent `shutdown_request`: note whether a restart follows. A live kernel
        then restarts in place (RESTARTING). True when the caller must `await_old_kernel`: the
        backend cannot see kernel processes, so the heartbeat tells when the old one is gone."""
        self._restart, self._old_gone = restart, False
        tracker = self.tracker
        if tracker is None or not restart:
            return False
        live = tracker.lifecycle.state in LIVE
        tracker.restart()
        return live and not self.backend.tracks_kernel_restarts

    async def await_old_kernel(self) -> None:
        """Wait (bounded) for the old kernel to stop answering, so that the restart does not
        talk to the dying kernel; `poll` reports it gone once it stopped."""
        if self.tracker is not None:
            gone = await self.tracker.wait_heartbeat(alive=False, within=OLD_KERNEL_SECONDS)
            self._old_gone = gone

    @property
    def restarting(self) -> bool:
        """A restart was asked for and its launch has not ended."""
        return self._restart

    def restarted_in_place(self) -> bool:
        """Asked to restart, the kernel keeps its admission and its old process is gone: the
        next launch only waits for the new one."""
        tracker = self.tracker
        return (
            self._restart
            and tracker is not None
            and tracker.lifecycle.state in IN_PLACE
            and self._old_kernel_stopped(tracker)
        )

    def _old_kernel_stopped(self, tracker: tracking.KernelTracker) -> bool:
        status = tracker.status
        return (
            self._old_gone
            or not status.kernel_alive
            or status.generation > tracker.restart_generation
        )

    # -- state, answered from memory -----------------------------------------------------------

    def poll(self) -> int | None:
        """None while the kernel runs or waits (also preempted); else its exit code; 0 once a
        kernel asked to restart stopped or waits (refreshing `last_activity` while it waits)."""
        tracker = self.tracker
        if tracker is None:
            return 0
        state = tracker.lifecycle.state
        if self._restart and (state in lifecycle.WAITING or self._old_kernel_stopped(tracker)):
            return 0
        if state in TERMINAL:
            code = tracker.status.exit_code
            return code if code is not None else 1
        if state in lifecycle.WAITING:
            # Preempted, waiting to come back: front ends poll every few seconds, which keeps
            # the culler away also where the server extension is not loaded (gateways).
            self.touch()
        return None

    async def wait_changed(self) -> None:
        """Return at the next change of the kernel's status or lifecycle."""
        assert self.tracker is not None
        await self.tracker.wait_changed()

    @property
    def live(self) -> bool:
        return self.tracker is not None and self.tracker.lifecycle.state in LIVE

    @property
    def waiting(self) -> bool:
        """True while the kernel waits for (re-)admission."""
        return self.tracker is not None and self.tracker.waiting

    @property
    def waited(self) -> float:
        """Seconds the latest launch spent before the kernel was live."""
        return self.tracker.waited if self.tracker is not None else 0.0

    @property
    def waiting_since(self) -> str | None:
        """ISO 8601 start of the kernel's current wait for (re-)admission; None when it runs."""
        since = self.tracker.waiting_since if self.tracker is not None else None
        return since.isoformat() if since is not None else None

    # -- parking -------------------------------------------------------------------------------

    @property
    def parked(self) -> bool:
        """The kernel is parked (or saving to park): its next cell brings it back."""
        return self.tracker is not None and self.tracker.lifecycle.state is KernelState.PARKED

    @property
    def parking(self) -> bool:
        """Parked but still saving: its admission (its GPUs) is not given back yet."""
        return (
            self.parked
            and self.tracker is not None
            and (self.tracker.status.phase is GroupPhase.PARKING)
        )

    async def park(self, *, idle_seconds: float | None = None) -> None:
        """Park a running kernel: it saves, gives back its admission and stays listed. Raises
        `ParkRefused` (nothing changed) when it does not run or saves no checkpoints."""
        who = f"kernel {short_id(self.kernel_id)}"
        tracker = self.tracker
        if tracker is not None and tracker.lifecycle.state is KernelState.PARKED:
            return
        state = lifecycle.shown(tracker.lifecycle) if tracker is not None else None
        if tracker is None or tracker.lifecycle.state not in LIVE:
            shown = f"is {state}" if state is not None else "has not started"
            raise errors.ParkRefused(
                f"{who} {shown}, not running: only a running kernel can be parked"
            )
        if self.spec is not None and not self.spec.checkpoint.enabled:
            raise errors.ParkRefused(
                f"{who} saves no checkpoints, so parking would lose its variables; turn on "
                "`checkpoint.enabled` in its kernelspec to park it"
            )
        self._parked_why = (
            "on request"
            if idle_seconds is None
            else f"after {lifecycle.idle_words(idle_seconds)} idle"
        )
        self._parked_since = datetime.datetime.now(datetime.UTC)
        await self.backend.park(tracker.ref, grace=self.grace)

    async def resume(self) -> None:
        """Wake a parked kernel: it goes back to its queue and comes back with its variables."""
        if self.tracker is not None and self.parked:
            await self.backend.resume(self.tracker.ref)

    async def cancel(self) -> None:
        """End a launch that has not reached a running kernel, whatever step it is at: not yet
        submitted, on its way to the backend, waiting in the queue, or admitted and starting.
        The launch raises `LaunchCancelled` and releases what it made; a live kernel stays."""
        tracker = self.tracker
        if tracker is not None and tracker.lifecycle.state in lifecycle.CANCELLABLE:
            await tracker.observe(lifecycle.Command.CANCEL)
        elif self._launching or tracker is None or tracker.lifecycle.state not in IN_PLACE:
            # A launch on its way, or one about to begin (jupyter's restarter relaunching a
            # kernel whose group ended): it cancels its group once it has one.
            self._cancelled = True

    def launch_coming(self, *, cancelled: bool = False) -> None:
        """A front end prepares a launch (jupyter's `pre_launch`): a cancel from now on ends
        it, also one that comes before `launch` runs (`cancelled`: one came already)."""
        self._launching = True
        self._cancelled = self._cancelled or cancelled

    def noted(self) -> Noted | None:
        """What a front end that persists its kernels keeps of this one (`note` takes it)."""
        since = self._parked_since.isoformat() if self._parked_since is not None else None
        noted = Noted.of(self.spec) if self.spec is not None else self._noted
        return replace(noted, parked_why=self._parked_why, parked_since=since) if noted else None

    def note(self, noted: Noted) -> None:
        """Take what a front end kept of this kernel before a restart (before `reattach`)."""
        self._noted, self._parked_why = noted, noted.parked_why
        with contextlib.suppress(TypeError, ValueError):
            since = noted.parked_since
            self._parked_since = datetime.datetime.fromisoformat(since) if since else None

    def message(self) -> str:
        """The sentence the user reads now ("" before the first submission)."""
        if self.tracker is None:
            return ""
        noted = self.noted()  # None for a group adopted with nothing kept: its needs unknown
        return self.tracker.describe(
            needs=noted.needs if noted else "",
            restored=bool(noted and noted.checkpoints),
            parked=self._parked_why,
            gpus=noted.gpus if noted else 0,
        )

    def queue_status(self) -> dict[str, Any] | None:
        """The kernel's queue state, as in status events; after a failed launch its last one
        (`failed`, with the sentence); None before the first launch."""
        tracker, noted = self.tracker, self.noted()
        if tracker is None or noted is None:
            return self._ended
        since = self._parked_since.isoformat() if self._parked_since is not None else None
        return events.status_payload(
            noted,
            tracker.ref.backend,
            tracker.lifecycle,
            tracker.status,
            self.message(),
            parked_since=since,
            failure=events.failure_kind(tracker.failure),
            has=events.failure_has(tracker.failure),
        )

    def _changed(self, state: Lifecycle, status: GroupStatus) -> None:
        message = self.message()
        if message == self._told:
            return
        self._told = message
        shown = lifecycle.shown(state)
        if shown in lifecycle.WAITING or shown is KernelState.ADMITTED:
            self.touch()
        self.tell(shown, message)

    # -- stopping and releasing ------------------------------------------------------------------

    @property
    def grace(self) -> float:
        """Seconds a graceful stop gives the kernel (its checkpoint's grace period)."""
        return self.spec.grace_seconds if self.spec else spec.DEFAULT_GRACE_SECONDS

    def cause(self, cause: StopCause, *, restart: bool = False) -> StopCause:
        """`cause`, or RESTART where a restart in place was asked for: jupyter does not pass
        the real flag to `terminate` and `kill` (jupyter_client #1061)."""
        return StopCause.RESTART if restart or self._restart else cause

    async def stop(self, cause: StopCause, *, grace: float | None = None) -> None:
        """Stop the kernel: at once for KILL, else within `grace` (default: its own)."""
        if self.tracker is None:
            return
        if grace is None:
            grace = 0.0 if cause is StopCause.KILL else self.grace
        await self.backend.stop(self.tracker.ref, grace=grace, cause=cause)

    async def send_signal(self, signum: int) -> None:
        if self.tracker is not None:
            await self.backend.send_signal(self.tracker.ref, signum)

    async def release(self) -> None:
        """Release the group; the submission is dropped only once that succeeded, so a
        release that failed is tried again by the next call."""
        tracker = self.tracker
        if tracker is None:
            return
        await tracker.release()
        await tracker.aclose()
        if self.tracker is tracker:
            self.tracker = None

    async def aclose(self) -> None:
        """Stop following the group (without releasing it)."""
        if self.tracker is not None:
            await self.tracker.aclose()
