"""`KueueProcessProxy`: Enterprise Gateway 3.x's process-proxy API over a queueing backend.

EG's `RemoteKernelManager` (jupyter_client 6) calls `launch_process` (awaited) and then
`poll`, `wait`, `send_signal`, `terminate`, `kill` and `cleanup` synchronously on the event
loop: those answer from the kernel's session (`session.py`) and hand any cluster call to a
task, never blocking. The launch waits for admission itself; EG's `kernel_launch_timeout` plays
no part. EG makes a new proxy for each restart: a restart in place hands the session over.
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

from kernel_queue import errors, lifecycle, spec
from kernel_queue.backends import BackendLease
from kernel_queue.gateway import launch
from kernel_queue.lifecycle import KernelState
from kernel_queue.model import GroupRef, Noted, StopCause, short_id
from kernel_queue.session import KernelSession

INFO_KEY = "kernel_queue"
"""Where `get_process_info` keeps the group reference in EG's persisted session."""

# Cluster calls started by the synchronous hooks; kept here so none is garbage-collected.
_tasks: set[asyncio.Task[None]] = set()
# kernel id -> the release `cleanup` scheduled, its session, and whether that session restarts
# in place: a restart (a new launch of the same kernel, which EG starts before the loop runs
# again) cancels the release and, for a restart in place, takes the session over.
_releases: dict[str, tuple[asyncio.Task[None], KernelSession, bool]] = {}


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
        self._session: KernelSession | None = None
        self._adopted: GroupRef | None = None  # from load_process_info, followed on first poll
        self._queue = ""  # of an adopted group
        self._noted: Noted | None = None  # what EG persisted of an adopted kernel's sentence
        self._launching = False  # a failure during launch is reported by the launch's error
        self._ending: asyncio.Task[None] | None = None  # kill: stop and release, under way
        self._exit_code = 0
        _watch_shutdown_requests(kernel_manager)

    # -- launch ------------------------------------------------------------------------------

    async def launch_process(self, kernel_cmd: Any, **kwargs: Any) -> KueueProcessProxy:
        """RemoteKernelManager._launch_kernel: queue the kernel; return once it runs.

        Bad config, a missing queue or a wait that ended become an HTTP error whose message
        names the fix, with nothing left in the cluster."""
        await super().launch_process(kernel_cmd, **kwargs)  # env, KERNEL_ID, authorization
        previous = self._take_over()
        self._launching = True
        try:
            await self._launch(kwargs["env"], previous)
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

    def _take_over(self) -> KernelSession | None:
        """A restart (EG makes a new proxy for it): stop the previous proxy's release. Return
        its session when the kernel restarts in place, so this launch only waits for the new
        process; otherwise the launch queues a new group behind the kept Secret and Service."""
        pending = _releases.pop(self.kernel_id, None)
        if pending is None:
            return None
        task, session, in_place = pending
        task.cancel()
        if not in_place:
            session.lease.forget()
            return None
        return session

    async def _launch(self, env: dict[str, str], session: KernelSession | None) -> None:
        km = self.kernel_manager
        options = launch.kernel_options(
            km.kernel_spec, self.proxy_config, parent=km, kernel_id=self.kernel_id
        )
        group = spec.build(options, argv_extra=[], cwd=None)
        if group.park_after:
            raise errors.ConfigError(
                f"kernelspec {km.kernel_name!r}: `park_after` is {group.park_after:g}, but "
                "Enterprise Gateway 3.x cannot park idle kernels (it has no hook that sees "
                "their cells); set `park_after` to 0, or serve the kernel from Jupyter Server "
                "with the kernel_queue extension"
            )
        key = km.session.key.decode()  # EG's key for this kernel: the same on every restart
        group = replace(
            spec.with_env(group, env, km.kernel_spec.env or {}),
            connection=replace(group.connection, key=key),
            user=env.get("KERNEL_USERNAME") or group.user,
        )
        if session is None:
            session = self._new_session(options.backend)
            session.spec = group
        else:
            session.attach(self._tell, self._touch)
        self._session = session
        deadline = launch.queue_deadline(options.admission_timeout, env)
        try:
            await session.launch(
                group, admission_timeout=deadline.seconds, startup_timeout=options.startup_timeout
            )
        except errors.AdmissionTimeout:
            if not deadline.from_client:
                raise
            waited = session.waited
            raise launch.client_gave_up(short_id(self.kernel_id), group.queue, waited) from None
        self._connect(session)

    def _connect(self, session: KernelSession) -> None:
        """Point EG's kernel manager at the kernel (its ports were chosen locally by EG)."""
        info = session.connection()
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
        if self._ending is not None and not self._ending.done():
            return None  # kill's release is under way: EG keeps the loop running meanwhile
        session = self._session
        if session is None or session.tracker is None:
            return None if self._follow_adopted() else self._exit_code
        return session.poll()

    def shutdown_requested(self, restart: bool) -> None:
        """After EG sent `shutdown_request` (see `_watch_shutdown_requests`): on a restart, watch
        the old kernel stop, so `poll` ends the shutdown without stopping the pod."""
        session = self._session
        if not restart or session is None or not session.live:
            return
        if session.shutdown_requested(restart):  # a pod: its heartbeat tells
            self._spawn(session.await_old_kernel())

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
        elif self._session is not None:
            self._spawn(self._session.send_signal(signum))
        return None

    def terminate(self) -> bool | None:
        """Stop the kernel gracefully (its checkpoint grace), in a task."""
        if self._session is not None:
            self._spawn(self._session.stop(StopCause.SHUTDOWN))
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
        session, self._session = self._session, None
        if session is None or session.tracker is None:
            return
        in_place = session.restarted_in_place()  # the next launch adopts the session
        task = self._spawn(self._release_session(session))
        if task is not None:
            _releases[self.kernel_id] = (task, session, in_place)
        super().cleanup()

    # -- persistence -------------------------------------------------------------------------

    def get_process_info(self) -> dict[str, Any]:
        """Persisted by EG's session manager: the group reference for `load_process_info`."""
        info: dict[str, Any] = super().get_process_info()
        tracker = self._session.tracker if self._session is not None else None
        ref = tracker.ref if tracker is not None else self._adopted
        if ref is not None:
            queue = tracker.queue if tracker is not None else self._queue
            info[INFO_KEY] = {"group": ref.to_dict(), "queue": queue}
            noted = self._session.noted() if self._session is not None else self._noted
            if noted is not None:
                info[INFO_KEY]["noted"] = noted.to_dict()
        return info

    def load_process_info(self, process_info: dict[str, Any]) -> None:
        """EG starting with persisted sessions: remember the group; `poll` follows it."""
        super().load_process_info(process_info)
        ours = process_info.get(INFO_KEY) or {}
        if ours.get("group"):
            self._adopted = GroupRef.from_dict(ours["group"])
            self._queue = str(ours.get("queue", ""))
            self._noted = Noted.from_dict(ours.get("noted"))
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
        self._session = self._new_session(ref.backend)
        if self._noted is not None:
            self._session.note(self._noted)
        self._session.adopt(ref, queue=self._queue)
        self.log.info("kernel %s: following its group %s again", self.kernel_id, ref.name)
        return True

    # -- internals ---------------------------------------------------------------------------

    def _new_session(self, backend: str) -> KernelSession:
        """A session on the shared backend `backend`, counted as used by EG until released:
        the last kernel to let go closes EG's backends (informers, API connections)."""
        owner = getattr(self.kernel_manager, "parent", None)  # EG's mapping kernel manager
        owner = owner if owner is not None else asyncio.get_running_loop()
        config = self.kernel_manager.config
        lease = BackendLease(backend, owner=owner, config=config, log=self.log, counted=True)
        return KernelSession(
            lease, kernel_id=self.kernel_id, log=self.log, tell=self._tell, touch=self._touch
        )

    def _touch(self) -> None:
        self.kernel_manager.last_activity = datetime.datetime.now(datetime.UTC)

    def _tell(self, state: KernelState, message: str) -> None:
        """Log each new sentence: EG 3 has no `reason` field to show it in."""
        if state in lifecycle.TERMINAL and self._launching:
            return  # launch_process raises it as the reply to the client, and logs it there
        if self._session is not None:
            self.log.info("kernel %s: %s", short_id(self.kernel_id), message)

    async def _end(self) -> None:
        if self._session is not None:
            await self._session.stop(StopCause.KILL)
        self._exit_code = -signal.SIGKILL
        await self._release()

    async def _release(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await self._release_session(session)

    async def _release_session(self, session: KernelSession) -> None:
        await asyncio.sleep(0)  # let a restart's launch, already under way, cancel this first
        try:
            await session.release()
        finally:
            await session.aclose()
            if _releases.get(session.kernel_id, (None,))[0] is asyncio.current_task():
                del _releases[session.kernel_id]
            await session.lease.aclose()

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
