"""`QueuedKernelProvisioner`: jupyter_client's provisioner API over a queueing backend.

An adapter: each hook validates or translates and then calls the kernel's session
(`session.py`: the lifecycle, restarts, `poll`'s answer, releases) or the spec builder
(`spec.py`). What a Jupyter server shows lives here: the kernel's `reason`, status events and
`last_activity`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, cast

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from typing_extensions import override

from kernel_queue import errors, events, jupyter_privates, lifecycle, spec
from kernel_queue.backends import BackendLease
from kernel_queue.lifecycle import KernelState
from kernel_queue.model import GroupRef, Noted, StopCause, short_id
from kernel_queue.options import KernelOptions
from kernel_queue.session import KernelSession

# How long `load_provisioner_info` waits for the backend to say where a reattached group stands.
_REATTACH_SECONDS = 30.0


class QueuedKernelProvisioner(KernelProvisionerBase, KernelOptions):  # type: ignore[metaclass]
    """Run a kernel only once its queue admits it; show its place while it waits.

    Every trait (`options.KernelOptions`) is a kernelspec `metadata.kernel_provisioner.config`
    key and can be set for all kernelspecs as `c.QueuedKernelProvisioner.<key>`; kernel.json wins.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.connection_info: KernelConnectionInfo = {}
        self._session: KernelSession | None = None
        self._refusal: dict[str, Any] | None = None  # a kernelspec config refused (`_refused`)
        self._cancelled = False  # a shutdown came before the kernel's session was made

    # -- jupyter_client hooks ----------------------------------------------------------------

    @property
    @override
    def has_process(self) -> bool:
        """True once the kernel's group was submitted and until it is released."""
        return self._session is not None and self._session.tracker is not None

    @override
    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """KernelManager, before every (re)start: validate config, choose ports and key.

        Bad config raises here, before anything is created.
        """
        extra = kwargs.pop("extra_arguments", [])
        session = self._session
        if session is None or session.spec is None:  # first launch, or reattached
            try:
                group = spec.build(self, argv_extra=extra, cwd=kwargs.get("cwd"))
                self._check_parking(group.park_after)
            except errors.KernelQueueError as exc:
                self._refused(exc)
                raise
            if session is None:
                session = self._session = self._new_session(self.backend)
            session.spec = group
        session.launch_coming(cancelled=self._cancelled)
        kwargs = await super().pre_launch(cmd=list(session.spec.argv), **kwargs)
        return kwargs

    @override
    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """KernelManager: queue the kernel and return its connection info once it runs.

        With pending kernels jupyter_server returns from `POST /api/kernels` at once and this
        waits; `cancel_launch` ends the wait. A restart in place waits for the new process.
        """
        session = self._session
        assert session is not None and session.spec is not None
        env = kwargs.get("env") or {}
        kernelspec_env = (self.kernel_spec.env or {}) if self.kernel_spec else {}
        await session.launch(
            spec.with_env(session.spec, env, kernelspec_env),
            admission_timeout=self.admission_timeout,
            startup_timeout=self.startup_timeout,
        )
        info = session.connection()
        info["key"] = info["key"].encode()  # jupyter_client compares keys as bytes
        self.connection_info = cast(KernelConnectionInfo, info)
        return self.connection_info

    @override
    async def poll(self) -> int | None:
        """None while the kernel runs or waits (also through preemption); else its exit code.

        Called by the restarter (every `time_to_dead`) and shutdown waits: answers from memory."""
        return 0 if self._session is None else self._session.poll()

    @override
    async def wait(self) -> int | None:
        """KernelManager, after stopping: return once `poll` reports an exit."""
        while (code := await self.poll()) is None:
            assert self._session is not None
            await self._session.wait_changed()
        return code

    @override
    async def send_signal(self, signum: int) -> None:
        """KernelManager.signal_kernel and signal-mode interrupts; the launcher forwards it."""
        if self._session is not None:
            await self._session.send_signal(signum)

    @override
    async def kill(self, restart: bool = False) -> None:
        """KernelManager: stop at once (an in-place restart when a restart was requested)."""
        if self._session is not None:
            cause = self._session.cause(StopCause.KILL, restart=restart)
            await self._session.stop(cause, grace=0.0)

    @override
    async def terminate(self, restart: bool = False) -> None:
        """KernelManager: stop gracefully. `restart` is always False here (jupyter_client #1061)."""
        if self._session is not None:
            await self._session.stop(self._session.cause(StopCause.SHUTDOWN, restart=restart))

    @override
    async def shutdown_requested(self, restart: bool = False) -> None:
        """KernelManager, after sending `shutdown_request`: note a restart; drop a queued kernel."""
        session = self._session
        if session is None:
            return
        watch_old_kernel = session.shutdown_requested(restart)
        if not restart and session.waiting:
            await session.stop(StopCause.SHUTDOWN, grace=0.0)
        elif watch_old_kernel:  # the pod stays; only its kernel process restarts
            await session.await_old_kernel()

    @override
    async def cleanup(self, restart: bool = False) -> None:
        """KernelManager, at the end of every shutdown: a final one releases everything; the
        group is forgotten only once its release succeeded (the next cleanup tries again)."""
        if not restart and self._session is not None:
            await self._session.release()

    @override
    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The restarter's "alive long enough": counted from start, not from the queue wait."""
        return recommended + (self._session.waited if self._session else 0.0)

    @override
    async def get_provisioner_info(self) -> dict[str, Any]:
        """Persisted by gateways; carries the group reference for `load_provisioner_info`."""
        info: dict[str, Any] = await super().get_provisioner_info()
        connection = dict(info.get("connection_info") or {})
        if isinstance(connection.get("key"), bytes):
            connection["key"] = connection["key"].decode()  # JSON-safe, as gateways store it
        info["connection_info"] = connection
        session = self._session
        tracker = session.tracker if session is not None else None
        if session is not None and tracker is not None:
            info["group"] = tracker.ref.to_dict()
            info["queue"] = tracker.queue
            noted = session.noted()
            if noted is not None:
                info["noted"] = noted.to_dict()
        return info

    @override
    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Reattach to a group after a server restart; `poll` answers right after."""
        await super().load_provisioner_info(provisioner_info)
        group = provisioner_info.get("group")
        if group is None:
            return
        ref = GroupRef.from_dict(group)
        self._session = self._new_session(ref.backend)
        noted = Noted.from_dict(provisioner_info.get("noted"))
        if noted is not None:
            self._session.note(noted)
        queue = str(provisioner_info.get("queue", ""))
        await self._session.reattach(ref, queue=queue, within=_REATTACH_SECONDS)

    # -- what the server extension reads (`server/kernels.py`) ---------------------------------

    @property
    def kernel_session(self) -> KernelSession | None:
        """The kernel's session, made by its first launch (or a reattach): its state, parking
        and queue status are read and driven there."""
        return self._session

    @property
    def refusal(self) -> dict[str, Any] | None:
        """The failed status of a kernelspec config refused before a session was made."""
        return self._refusal

    async def cancel_launch(self) -> None:
        """Shut down a kernel that has not started yet, at any step of its launch (before its
        session is made, submitting, waiting, starting): the launch raises `LaunchCancelled`."""
        if self._session is not None:
            await self._session.cancel()
        else:
            self._cancelled = True

    def _queue_status(self) -> dict[str, Any] | None:
        """The kernel's queue state, as in status events; None before the first launch."""
        if self._session is not None:
            return self._session.queue_status()
        return self._refusal

    def _refused(self, error: errors.KernelQueueError) -> None:
        """Its kernelspec config was refused before anything was built: a failed kernel, listed
        and told as any (the server's listing, a status event, its `reason`)."""
        config = {"backend": self.backend, "queue": self.queue, "gpus": self.gpus}
        self._refusal = events.refused_payload(self.kernel_id or "", config, error)
        self._tell(KernelState.FAILED, str(error))

    # -- internals ---------------------------------------------------------------------------

    def _new_session(self, backend: str) -> KernelSession:
        lease = BackendLease(backend, owner=self._owner(), config=self.config, log=self.log)
        return KernelSession(
            lease, kernel_id=self.kernel_id or "", log=self.log, tell=self._tell, touch=self._touch
        )

    def _owner(self) -> Any:
        """What shares one backend instance: the server's multi-kernel manager, else the loop
        (kernel managers used on their own share one backend per event loop)."""
        # Not `or`: a MultiKernelManager with no kernels yet is falsy (it defines __len__).
        owner = getattr(self.parent, "parent", None)
        return owner if owner is not None else asyncio.get_running_loop()

    def _check_parking(self, park_after: float) -> None:
        """`park_after` needs a kernel manager that parks idle kernels (the server extension's
        `QueuedMappingKernelManager` says so with `parks_idle_kernels`); elsewhere (Kernel
        Gateway, a kernel manager of one's own) the kernel would never be parked."""
        manager = getattr(self.parent, "parent", None)
        if not park_after or getattr(manager, "parks_idle_kernels", False):
            return
        kind = type(manager).__name__ if manager is not None else "none"
        raise errors.ConfigError(
            f"`park_after` is {park_after:g} but this server does not park idle kernels (its "
            f"kernel manager is {kind}); run Jupyter Server with the kernel_queue server "
            "extension, or set `park_after` to 0"
        )

    def _touch(self) -> None:
        if self.parent is not None:
            self.parent.last_activity = datetime.datetime.now(datetime.UTC)

    def _tell(self, state: KernelState, message: str) -> None:
        """A new sentence: logged, the `reason` while not live, and a status event."""
        km = self.parent
        # A launch that fails is logged once at ERROR by the kernel manager (its OnceFilter);
        # a kernel that fails later, here.
        ready = jupyter_privates.start_future(km)
        failed = state is KernelState.FAILED
        launching = ready is not None and not ready.done()
        if message:
            level = (logging.DEBUG if launching else logging.ERROR) if failed else logging.INFO
            self.log.log(level, "kernel %s: %s", short_id(self.kernel_id or ""), message)
        if km is None:
            return
        if hasattr(km, "reason"):
            km.reason = "" if state in lifecycle.LIVE else message
        logger = getattr(km, "event_logger", None)
        if logger is not None and events.SCHEMA_ID in logger.schemas.schema_ids:
            data = self._queue_status()
            if data is not None:
                logger.emit(schema_id=events.SCHEMA_ID, data=data)


__all__ = ["QueuedKernelProvisioner"]
