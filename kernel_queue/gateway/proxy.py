"""`KueueProcessProxy`: Enterprise Gateway 3.x's process-proxy API over a queueing backend.

EG's `RemoteKernelManager` (jupyter_client 6) calls `launch_process` (awaited) and then
`poll`, `wait`, `send_signal`, `terminate`, `kill` and `cleanup` synchronously on the event
loop: those answer from the tracker's memory and hand any cluster call to a task, never
blocking. The launch waits for admission itself; EG's `kernel_launch_timeout` plays no part.
Nothing here talks to Kubernetes: `backends`, `spec` and `tracking` do, as for the provisioner.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import Any

from enterprise_gateway.services.processproxies.processproxy import BaseProcessProxyABC
from tornado import web

from kernel_queue import backends, errors, lifecycle, spec
from kernel_queue.gateway import launch
from kernel_queue.lifecycle import KernelState, Lifecycle
from kernel_queue.model import GroupRef, GroupSpec, GroupStatus, StopCause, short_id
from kernel_queue.tracking import KernelTracker

INFO_KEY = "kernel_queue"
"""Where `get_process_info` keeps the group reference in EG's persisted session."""

# Cluster calls started by the synchronous hooks; kept here so none is garbage-collected.
_tasks: set[asyncio.Task[None]] = set()
# kernel id -> release scheduled by `cleanup`; a restart (a new launch of the same kernel,
# which EG starts before the loop runs again) takes the group over instead.
_releases: dict[str, asyncio.Task[None]] = {}


class KueueProcessProxy(BaseProcessProxyABC):  # type: ignore[misc]
    """Runs an Enterprise Gateway kernel as a queued group on the kernelspec's backend."""

    def __init__(self, kernel_manager: Any, proxy_config: Mapping[str, Any] | None) -> None:
        super().__init__(kernel_manager, dict(proxy_config or {}))
        self._tracker: KernelTracker | None = None
        self._backend: backends.ClusterBackend | None = None
        self._adopted: GroupRef | None = None  # from load_process_info, followed on first poll
        self._group: GroupSpec | None = None  # None for a group adopted after an EG restart
        self._queue = ""
        self._needs = ""
        self._last_message = ""

    # -- launch ------------------------------------------------------------------------------

    async def launch_process(self, kernel_cmd: Any, **kwargs: Any) -> KueueProcessProxy:
        """RemoteKernelManager._launch_kernel: queue the kernel; return once it runs.

        Bad config, a missing queue or a wait that ended become an HTTP error whose message
        names the fix, with nothing left in the cluster."""
        await super().launch_process(kernel_cmd, **kwargs)  # env, KERNEL_ID, authorization
        pending = _releases.pop(self.kernel_id, None)
        if pending is not None:
            pending.cancel()  # a restart: the new launch reuses the Secret and the Service
        env: dict[str, str] = kwargs["env"]
        try:
            await self._launch(env)
        except errors.KernelQueueError as exc:
            await self._release()
            status, reason, message = launch.reply(exc)
            self.log.error("kernel %s: %s", self.kernel_id, message)
            raise web.HTTPError(status, message.replace("%", "%%"), reason=reason) from exc
        except BaseException:
            await self._release()
            raise
        return self

    async def _launch(self, env: dict[str, str]) -> None:
        km = self.kernel_manager
        options = launch.kernel_options(
            km.kernel_spec, self.proxy_config, parent=km, kernel_id=self.kernel_id
        )
        group = spec.build(options, argv_extra=[], cwd=None)
        key = km.session.key.decode()  # EG's key for this kernel: the same on every restart
        group = replace(
            spec.with_env(group, env, km.kernel_spec.env or {}),
            connection=replace(group.connection, key=key),
            user=env.get("KERNEL_USERNAME") or group.user,
        )
        self._backend = backends.get_backend(
            options.backend, owner=self._owner(), config=km.config, log=self.log
        )
        self._group, self._queue, self._needs = group, group.queue, group.needs()
        ref = await self._backend.submit(group)
        self._tracker = self._track(ref)
        deadline = launch.queue_deadline(options.admission_timeout, env)
        try:
            await self._tracker.wait_live(
                admission_timeout=deadline.seconds, startup_timeout=options.startup_timeout
            )
        except errors.AdmissionTimeout:
            if not deadline.from_client:
                raise
            waited = self._tracker.waited
            raise launch.client_gave_up(short_id(self.kernel_id), group.queue, waited) from None
        self._connect(self._tracker)

    def _connect(self, tracker: KernelTracker) -> None:
        """Point EG's kernel manager at the kernel (its ports were chosen locally by EG)."""
        info = tracker.ref.connection.to_dict()
        if tracker.status.address:
            info["ip"] = tracker.status.address  # connect = "pod-ip"
        km = self.kernel_manager
        km.shell_port = km.iopub_port = km.stdin_port = km.hb_port = km.control_port = 0
        km.load_connection_info(info)
        self.ip = info["ip"]

    # -- state, answered from memory ---------------------------------------------------------

    def poll(self) -> int | None:
        """None while the kernel runs or waits (also through a preemption); else its exit code.

        Right after `load_process_info` (EG starting, no loop running yet) it answers None;
        the restarter's next poll starts following the group and learns the truth."""
        tracker = self._tracker
        if tracker is None:
            return None if self._follow_adopted() else 0
        if tracker.lifecycle.state in lifecycle.TERMINAL:
            code = tracker.status.exit_code
            return code if code is not None else 1
        return None

    def wait(self) -> int | None:
        """After `poll` reported an exit (EG never waits on a live kernel): the exit code."""
        return self.poll()

    def send_signal(self, signum: int) -> bool | None:
        """0 asks "alive?" (None if so); SIGTERM and SIGKILL stop the group; other signals go
        to the backend (pods take none: use message-mode interrupts)."""
        if signum == 0:
            return None if self.poll() is None else False
        if signum == signal.SIGKILL:
            self.kill()
        elif signum == signal.SIGTERM:
            self.terminate()
        elif self._tracker is not None and self._backend is not None:
            self._spawn(self._backend.send_signal(self._tracker.ref, signum))
        return None

    def terminate(self) -> bool | None:
        """Stop the kernel gracefully (its checkpoint grace), in a task."""
        self._spawn(self._stop(StopCause.SHUTDOWN))
        return None

    def kill(self) -> bool | None:
        """Stop the kernel at once, in a task."""
        self._spawn(self._stop(StopCause.KILL))
        return None

    def cleanup(self) -> None:
        """RemoteKernelManager.cleanup_resources: release the group (Workload, pods, Service,
        Secret) in a task, unless a restart's new launch of this kernel takes it over."""
        tracker, self._tracker = self._tracker, None
        if tracker is None or self._backend is None:
            return
        task = self._spawn(self._release_tracked(tracker, self._backend))
        if task is not None:
            _releases[self.kernel_id] = task
        super().cleanup()

    # -- persistence -------------------------------------------------------------------------

    def get_process_info(self) -> dict[str, Any]:
        """Persisted by EG's session manager: the group reference for `load_process_info`."""
        info: dict[str, Any] = super().get_process_info()
        ref = self._tracker.ref if self._tracker is not None else self._adopted
        if ref is not None:
            info[INFO_KEY] = {"group": ref.to_dict(), "queue": self._queue}
        return info

    def load_process_info(self, process_info: dict[str, Any]) -> None:
        """EG starting with persisted sessions: remember the group; `poll` follows it."""
        super().load_process_info(process_info)
        ours = process_info.get(INFO_KEY) or {}
        if ours.get("group"):
            self._adopted = GroupRef.from_dict(ours["group"])
            self._queue = str(ours.get("queue", ""))
            self.ip = self._adopted.connection.ip
            self._follow_adopted()

    def _follow_adopted(self) -> bool:
        """Start following an adopted group once a loop runs; False if there is none."""
        ref = self._adopted
        if ref is None:
            return False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return True  # EG's startup, before its loop runs
        self._adopted = None
        self._backend = backends.get_backend(
            ref.backend, owner=self._owner(), config=self.kernel_manager.config, log=self.log
        )
        self._tracker = self._track(ref)
        self.log.info("kernel %s: following its group %s again", self.kernel_id, ref.name)
        return True

    # -- internals ---------------------------------------------------------------------------

    def _owner(self) -> Any:
        """What shares one backend: EG's mapping kernel manager (else the loop)."""
        owner = getattr(self.kernel_manager, "parent", None)
        return owner if owner is not None else asyncio.get_running_loop()

    def _track(self, ref: GroupRef) -> KernelTracker:
        backend, group = self._backend, self._group
        assert backend is not None

        async def requeue() -> object:
            return await backend.submit(group) if group is not None else None

        tracker = KernelTracker(
            backend, ref, queue=self._queue, notify=self._notify, requeue=requeue
        )
        tracker.start()
        return tracker

    def _notify(self, state: Lifecycle, status: GroupStatus) -> None:
        """Log each new sentence: EG 3 has no `reason` field to show it in."""
        tracker = self._tracker
        if (
            tracker is not None
            and tracker.failure is not None
            and state.state is KernelState.FAILED
        ):
            message = str(tracker.failure)
        else:
            message = lifecycle.describe(state, status, queue=self._queue, needs=self._needs)
        if message != self._last_message:
            self._last_message = message
            self.log.info("kernel %s: %s", short_id(self.kernel_id), message)

    async def _stop(self, cause: StopCause) -> None:
        tracker, backend = self._tracker, self._backend
        if tracker is not None and backend is not None:
            grace = self._group.grace_seconds if self._group else spec.DEFAULT_GRACE_SECONDS
            await backend.stop(
                tracker.ref, grace=0.0 if cause is StopCause.KILL else grace, cause=cause
            )

    async def _release(self) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None and self._backend is not None:
            await self._release_tracked(tracker, self._backend)

    async def _release_tracked(
        self, tracker: KernelTracker, backend: backends.ClusterBackend
    ) -> None:
        await asyncio.sleep(0)  # let a restart's launch, already under way, cancel this first
        try:
            if not tracker.released:
                tracker.released = True
                await backend.release(tracker.ref)
        finally:
            await tracker.aclose()
            if _releases.get(tracker.ref.kernel_id) is asyncio.current_task():
                del _releases[tracker.ref.kernel_id]

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        """Run `work` on the loop, logging its failure; None (and nothing run) without a loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            work.close()
            return None
        task = loop.create_task(work)
        _tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        _tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("kernel %s: %s", self.kernel_id, task.exception())
