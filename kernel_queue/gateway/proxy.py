"""`KueueProcessProxy`: Enterprise Gateway 3.x's process-proxy API over a queueing backend.

EG's `RemoteKernelManager` (jupyter_client 6) calls `launch_process` (awaited) and then
`poll`, `wait`, `send_signal`, `terminate`, `kill` and `cleanup` synchronously on the event
loop: those answer from the tracker's memory and hand any cluster call to a task, never
blocking. The launch waits for admission itself; EG's `kernel_launch_timeout` plays no part.
Nothing here talks to Kubernetes: `backends`, `spec` and `tracking` do, as for the provisioner.
"""

from __future__ import annotations

import asyncio
import datetime
import signal
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import Any

from enterprise_gateway.services.processproxies.processproxy import BaseProcessProxyABC
from tornado import ioloop, web

from kernel_queue import backends, errors, lifecycle, spec
from kernel_queue.gateway import launch
from kernel_queue.lifecycle import Lifecycle
from kernel_queue.model import GroupRef, GroupSpec, GroupStatus, StopCause, short_id
from kernel_queue.options import KernelOptions
from kernel_queue.tracking import KernelTracker

INFO_KEY = "kernel_queue"
"""Where `get_process_info` keeps the group reference in EG's persisted session."""

# Cluster calls started by the synchronous hooks; kept here so none is garbage-collected.
_tasks: set[asyncio.Task[None]] = set()
# kernel id -> release scheduled by `cleanup`; a restart (a new launch of the same kernel,
# which EG starts before the loop runs again) takes the group over instead.
_releases: dict[str, tuple[asyncio.Task[None], KueueProcessProxy]] = {}


# id(owner) -> proxies using that owner's backends; the last one to let go closes them, so
# nothing (informers, API connections) outlives EG's final shutdown of its kernels.
_users: dict[int, int] = {}


def _watch_shutdown_requests(km: Any) -> None:
    """Make `km.request_shutdown(restart)` tell the kernel's current proxy.

    EG 3 gives process proxies no such hook, and a restart in place needs the flag: the pod
    stays and only its kernel process restarts. Done once per kernel manager."""
    if getattr(km, "_kernel_queue_watched", False):
        return
    original = km.request_shutdown

    def request_shutdown(restart: bool = False) -> None:
        original(restart)
        proxy = getattr(km, "process_proxy", None)
        if isinstance(proxy, KueueProcessProxy):
            proxy.shutdown_requested(restart)

    km.request_shutdown = request_shutdown
    km._kernel_queue_watched = True


class KueueProcessProxy(BaseProcessProxyABC):  # type: ignore[misc]
    """Runs an Enterprise Gateway kernel as a queued group on the kernelspec's backend."""

    def __init__(self, kernel_manager: Any, proxy_config: Mapping[str, Any] | None) -> None:
        super().__init__(kernel_manager, dict(proxy_config or {}))
        self._tracker: KernelTracker | None = None
        self._backend: backends.ClusterBackend | None = None
        self._adopted: GroupRef | None = None  # from load_process_info, followed on first poll
        self._group: GroupSpec | None = None  # None for a group adopted after an EG restart
        self._queue = ""
        self._last_message = ""
        self._launching = False  # a failure during launch is reported by the launch's error
        self._owner_in_use: Any = None  # whose backends this proxy counts as used
        self._ending: asyncio.Task[None] | None = None  # kill: stop and release, under way
        self._exit_code = 0
        self._startup_timeout = KernelOptions.startup_timeout.default_value
        self._old_kernel_gone = False  # asked to restart, and the old kernel stopped answering
        self._handover: KernelTracker | None = None  # for the next launch: restart in place
        _watch_shutdown_requests(kernel_manager)

    # -- launch ------------------------------------------------------------------------------

    async def launch_process(self, kernel_cmd: Any, **kwargs: Any) -> KueueProcessProxy:
        """RemoteKernelManager._launch_kernel: queue the kernel; return once it runs.

        Bad config, a missing queue or a wait that ended become an HTTP error whose message
        names the fix, with nothing left in the cluster."""
        await super().launch_process(kernel_cmd, **kwargs)  # env, KERNEL_ID, authorization
        previous = self._take_over()
        env: dict[str, str] = kwargs["env"]
        self._launching = True
        try:
            if previous is not None:
                await self._restarted_in_place(previous)
            else:
                await self._launch(env)
        except errors.KernelQueueError as exc:
            await self._release()
            status, reason, message = launch.reply(exc)
            self.log.error("kernel %s: %s", self.kernel_id, message)
            raise web.HTTPError(status, message.replace("%", "%%"), reason=reason) from exc
        except BaseException:
            await self._release()
            raise
        finally:
            self._launching = False
        return self

    def _take_over(self) -> KueueProcessProxy | None:
        """A restart (EG makes a new proxy for it): stop the previous proxy's release. Return it
        when its kernel restarted in place, so this launch only waits for the new process;
        otherwise the launch queues a new group behind the kept Secret and Service."""
        pending = _releases.pop(self.kernel_id, None)
        if pending is None:
            return None
        task, previous = pending
        task.cancel()
        if previous._handover is None:
            previous._forget_owner()
            return None
        return previous

    async def _restarted_in_place(self, previous: KueueProcessProxy) -> None:
        """Adopt the previous proxy's group, whose pod restarts the kernel in place (the
        admission is kept), and wait for the new kernel process to answer."""
        tracker, previous._handover = previous._handover, None
        assert tracker is not None
        self._tracker, self._backend, self._group = tracker, previous._backend, previous._group
        self._queue = previous._queue
        self._owner_in_use, previous._owner_in_use = previous._owner_in_use, None
        within = self._startup_timeout = previous._startup_timeout
        await tracker.wait_back(within=within)
        self._connect(tracker)

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
        self._backend = self._use_backend(options.backend)
        self._group, self._queue = group, group.queue
        self._startup_timeout = options.startup_timeout
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
        info["ip"] = tracker.address
        km = self.kernel_manager
        km.shell_port = km.iopub_port = km.stdin_port = km.hb_port = km.control_port = 0
        km.load_connection_info(info)
        self.ip = info["ip"]

    # -- state, answered from memory ---------------------------------------------------------

    def poll(self) -> int | None:
        """None while the kernel runs or waits (also through a preemption); else its exit code.
        0 once a kernel asked to restart has stopped answering (its pod restarts it in place).

        Right after `load_process_info` (EG starting, no loop running yet) it answers None;
        the restarter's next poll starts following the group and learns the truth."""
        if self._old_kernel_gone:
            return 0
        if self._ending is not None and not self._ending.done():
            return None  # kill's release is under way: EG keeps the loop running meanwhile
        tracker = self._tracker
        if tracker is None:
            return None if self._follow_adopted() else self._exit_code
        if tracker.lifecycle.state in lifecycle.TERMINAL:
            code = tracker.status.exit_code
            return code if code is not None else 1
        if tracker.waiting:  # preempted, waiting to come back: EG's culler leaves it alone
            self.kernel_manager.last_activity = datetime.datetime.now(datetime.UTC)
        return None

    def shutdown_requested(self, restart: bool) -> None:
        """After EG sent `shutdown_request` (see `_watch_shutdown_requests`): on a restart, watch
        the old kernel's heartbeat stop, so `poll` ends the shutdown without stopping the pod."""
        tracker = self._tracker
        if restart and tracker is not None and tracker.lifecycle.state in lifecycle.LIVE:
            tracker.restart()
            self._spawn(self._await_old_kernel(tracker))

    async def _await_old_kernel(self, tracker: KernelTracker) -> None:
        # Bounded: a kernel that ignores the request is terminated by EG as usual (and requeued).
        self._old_kernel_gone = await tracker.wait_heartbeat(alive=False, within=10.0)

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
        """Stop the kernel at once and release everything, in a task `poll` waits for.

        EG's own exit shuts kernels down this way (`now=True`) and then closes its loop: a
        release left for `cleanup` would never run."""
        if self._ending is None or self._ending.done():
            self._ending = self._spawn(self._end())
        return None

    def cleanup(self) -> None:
        """RemoteKernelManager.cleanup_resources: release the group (Workload, pods, Service,
        Secret) in a task, unless a restart's new launch of this kernel takes it over."""
        tracker, self._tracker = self._tracker, None
        if tracker is None or self._backend is None:
            return
        if self._old_kernel_gone and tracker.lifecycle.state in lifecycle.IN_PLACE:
            self._handover = tracker  # restarting in place: the next launch adopts the group
        task = self._spawn(self._release_tracked(tracker))
        if task is not None:
            _releases[self.kernel_id] = (task, self)
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
            # EG revives sessions before its loop runs: follow the group as soon as it does.
            ioloop.IOLoop.current().add_callback(self._follow_adopted)

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
        self._backend = self._use_backend(ref.backend)
        self._tracker = self._track(ref)
        self.log.info("kernel %s: following its group %s again", self.kernel_id, ref.name)
        return True

    # -- internals ---------------------------------------------------------------------------

    def _owner(self) -> Any:
        """What shares one backend: EG's mapping kernel manager (else the loop)."""
        owner = getattr(self.kernel_manager, "parent", None)
        return owner if owner is not None else asyncio.get_running_loop()

    def _use_backend(self, name: str) -> backends.ClusterBackend:
        """The shared backend `name`, counted as used by this proxy until `_let_go`."""
        assert self._owner_in_use is None
        owner = self._owner()
        self._owner_in_use = owner
        _users[id(owner)] = _users.get(id(owner), 0) + 1
        config = self.kernel_manager.config
        return backends.get_backend(name, owner=owner, config=config, log=self.log)

    async def _let_go(self) -> None:
        """Stop using the backend; close the owner's backends if no proxy uses them now."""
        owner = self._owner_in_use
        if self._forget_owner():
            await backends.aclose_all(owner)

    def _forget_owner(self) -> bool:
        """Stop counting this proxy as a user; True if it was the owner's last."""
        owner, self._owner_in_use = self._owner_in_use, None
        if owner is None:
            return False
        _users[id(owner)] -= 1
        if _users[id(owner)]:
            return False
        del _users[id(owner)]
        return True

    def _track(self, ref: GroupRef) -> KernelTracker:
        assert self._backend is not None
        tracker = KernelTracker(self._backend, ref, queue=self._queue, notify=self._notify)
        tracker.start()
        return tracker

    def _notify(self, state: Lifecycle, status: GroupStatus) -> None:
        """Log each new sentence: EG 3 has no `reason` field to show it in."""
        tracker = self._tracker
        if state.state in lifecycle.TERMINAL and self._launching:
            return  # launch_process raises it as the reply to the client, and logs it there
        if tracker is None:
            return
        group = self._group  # None for a group adopted after an EG restart
        message = tracker.describe(
            needs=group.needs() if group else "", restored=bool(group and group.checkpoint.enabled)
        )
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

    async def _end(self) -> None:
        await self._stop(StopCause.KILL)
        self._exit_code = -signal.SIGKILL
        await self._release()

    async def _release(self) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None and self._backend is not None:
            await self._release_tracked(tracker)
        else:
            await self._let_go()

    async def _release_tracked(self, tracker: KernelTracker) -> None:
        await asyncio.sleep(0)  # let a restart's launch, already under way, cancel this first
        try:
            await tracker.release()
        finally:
            await tracker.aclose()
            if _releases.get(tracker.ref.kernel_id, (None,))[0] is asyncio.current_task():
                del _releases[tracker.ref.kernel_id]
            await self._let_go()

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
