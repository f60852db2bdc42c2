"""`QueuedKernelProvisioner`: jupyter_client's provisioner API over a queueing backend.

An adapter: each hook validates or translates and then calls the backend (`backends/`), the
tracker (`tracking.py`, which runs the lifecycle) or the spec builder (`spec.py`). It keeps the
Jupyter-facing side effects in one place: the kernel's `reason`, status events, `last_activity`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any, cast

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from typing_extensions import override

from kernel_queue import backends, events, lifecycle, spec
from kernel_queue.lifecycle import KernelState, Lifecycle
from kernel_queue.model import GroupRef, GroupSpec, GroupStatus, StopCause, short_id
from kernel_queue.options import KernelOptions
from kernel_queue.tracking import KernelTracker

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
        self._spec: GroupSpec | None = None
        self._tracker: KernelTracker | None = None
        self._backend: backends.ClusterBackend | None = None
        self._restart_requested = False
        self._old_kernel_gone = False
        self._last_message: str | None = None

    # -- jupyter_client hooks ----------------------------------------------------------------

    @property
    @override
    def has_process(self) -> bool:
        """True once the kernel's group was submitted and until it is released."""
        return self._tracker is not None

    @override
    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """KernelManager, before every (re)start: validate config, choose ports and key.

        Bad config raises here, before anything is created.
        """
        extra = kwargs.pop("extra_arguments", [])
        if self._spec is None:
            self._spec = spec.build(self, argv_extra=extra, cwd=kwargs.get("cwd"))
            self._backend = backends.get_backend(
                self.backend, owner=self._owner(), config=self.config, log=self.log
            )
        kwargs = await super().pre_launch(cmd=list(self._spec.argv), **kwargs)
        return kwargs

    @override
    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """KernelManager: queue the kernel and return its connection info once it runs.

        With pending kernels jupyter_server returns from `POST /api/kernels` at once and this
        waits; `cancel_launch` ends the wait. A restart in place waits for the new process.
        """
        assert self._spec is not None and self._backend is not None
        tracker = self._tracker
        if tracker is not None and tracker.lifecycle.state in lifecycle.IN_PLACE:
            if self._sees_restarts():
                await tracker.wait_restarted(within=self.startup_timeout)
            else:
                await tracker.wait_back(within=self.startup_timeout)
        try:
            if tracker is None or tracker.lifecycle.state in lifecycle.TERMINAL:
                tracker = await self._submit(self._spec, kwargs.get("env") or {})
            await tracker.wait_live(
                admission_timeout=self.admission_timeout, startup_timeout=self.startup_timeout
            )
        except BaseException:
            try:
                await self._release()
            except Exception as exc:  # the launch's own failure is the one the user reads
                self.log.warning(
                    "kernel %s: release failed: %s", short_id(self.kernel_id or ""), exc
                )
            raise
        self._restart_requested = False
        info = tracker.ref.connection.to_dict()
        info["ip"] = tracker.address
        info["key"] = info["key"].encode()  # jupyter_client compares keys as bytes
        self.connection_info = cast(KernelConnectionInfo, info)
        return self.connection_info

    @override
    async def poll(self) -> int | None:
        """None while the kernel runs or waits (also through preemption); else its exit code.

        Called by the restarter (every `time_to_dead`) and shutdown waits: answers from memory."""
        tracker = self._tracker
        if tracker is None:
            return 0
        state, status = tracker.lifecycle.state, tracker.status
        if self._restart_requested and (
            state in lifecycle.WAITING
            or self._old_kernel_gone
            or not status.kernel_alive
            or status.generation > tracker.restart_generation
        ):
            return 0
        if state in lifecycle.TERMINAL:
            return status.exit_code if status.exit_code is not None else 1
        if state in lifecycle.WAITING and self.parent is not None:
            # Preempted, waiting to come back: the restarter polls every few seconds, which
            # keeps the culler away also where the server extension is not loaded (gateways).
            self.parent.last_activity = datetime.datetime.now(datetime.UTC)
        return None

    @override
    async def wait(self) -> int | None:
        """KernelManager, after stopping: return once `poll` reports an exit."""
        while (code := await self.poll()) is None:
            assert self._tracker is not None
            await self._tracker.wait_changed()
        return code

    @override
    async def send_signal(self, signum: int) -> None:
        """KernelManager.signal_kernel and signal-mode interrupts; the launcher forwards it."""
        if self._tracker is not None and self._backend is not None:
            await self._backend.send_signal(self._tracker.ref, signum)

    @override
    async def kill(self, restart: bool = False) -> None:
        """KernelManager: stop at once (an in-place restart when a restart was requested)."""
        await self._stop(0.0, StopCause.RESTART if self._restarting(restart) else StopCause.KILL)

    @override
    async def terminate(self, restart: bool = False) -> None:
        """KernelManager: stop gracefully. `restart` is always False here (jupyter_client #1061)."""
        grace = self._spec.grace_seconds if self._spec else spec.DEFAULT_GRACE_SECONDS
        await self._stop(
            grace, StopCause.RESTART if self._restarting(restart) else StopCause.SHUTDOWN
        )

    @override
    async def shutdown_requested(self, restart: bool = False) -> None:
        """KernelManager, after sending `shutdown_request`: note a restart; drop a queued kernel."""
        tracker = self._tracker
        self._restart_requested = restart
        self._old_kernel_gone = False
        if tracker is None:
            return
        live = tracker.lifecycle.state in lifecycle.LIVE
        if restart:
            tracker.restart()
        if not restart and tracker.waiting:
            await self._stop(0.0, StopCause.SHUTDOWN)
        elif restart and live and not self._sees_restarts():
            # The pod stays; only the kernel process restarts. Wait (bounded) for the old one
            # to stop answering, so the restart does not talk to the dying kernel.
            self._old_kernel_gone = await tracker.wait_heartbeat(alive=False, within=10.0)

    @override
    async def cleanup(self, restart: bool = False) -> None:
        """KernelManager, at the end of every shutdown: a final one releases everything."""
        if not restart:
            await self._release()

    @override
    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The restarter's "alive long enough": counted from start, not from the queue wait."""
        waited = self._tracker.waited if self._tracker else 0.0
        return recommended + waited

    @override
    async def get_provisioner_info(self) -> dict[str, Any]:
        """Persisted by gateways; carries the group reference for `load_provisioner_info`."""
        info: dict[str, Any] = await super().get_provisioner_info()
        connection = dict(info.get("connection_info") or {})
        if isinstance(connection.get("key"), bytes):
            connection["key"] = connection["key"].decode()  # JSON-safe, as gateways store it
        info["connection_info"] = connection
        if self._tracker is not None:
            info["group"] = self._tracker.ref.to_dict()
            info["queue"] = self._tracker.queue
        return info

    @override
    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Reattach to a group after a server restart; `poll` answers right after."""
        await super().load_provisioner_info(provisioner_info)
        group = provisioner_info.get("group")
        if group is None:
            return
        ref = GroupRef.from_dict(group)
        self._backend = backends.get_backend(
            ref.backend, owner=self._owner(), config=self.config, log=self.log
        )
        self._tracker = self._track(ref, queue=str(provisioner_info.get("queue", "")))
        self._tracker.start()
        # `poll` must answer right after loading: wait (bounded) for the backend's first word.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_REATTACH_SECONDS):
                await self._tracker.observed.wait()
        if self._tracker.lifecycle.state in lifecycle.TERMINAL:
            self.log.warning("kernel %s: its group %s is gone", short_id(ref.kernel_id), ref.name)

    # -- cooperative cancel and queue state (used by the server extension) ------------------

    @property
    def waiting_in_queue(self) -> bool:
        """True while the kernel waits for (re-)admission; the culler leaves it alone."""
        return self._tracker is not None and self._tracker.waiting

    async def cancel_launch(self) -> None:
        """Shut down a kernel that is still waiting: its launch raises `LaunchCancelled` now."""
        if self._tracker is not None and self._tracker.waiting:
            await self._tracker.observe(lifecycle.Command.CANCEL)

    @property
    def waiting_since(self) -> str | None:
        """ISO 8601 start of the kernel's current wait for (re-)admission; None when it runs."""
        since = self._tracker.waiting_since if self._tracker is not None else None
        return since.isoformat() if since is not None else None

    def queue_status(self) -> dict[str, Any] | None:
        """The kernel's queue state, as in status events; None before the first launch."""
        if self._tracker is None or self._spec is None:
            return None
        tracker = self._tracker
        return events.status_payload(
            self._spec, tracker.ref.backend, tracker.lifecycle, tracker.status, self._message()
        )

    # -- internals ---------------------------------------------------------------------------

    def _owner(self) -> Any:
        """What shares one backend instance: the server's multi-kernel manager, else the loop
        (kernel managers used on their own share one backend per event loop)."""
        # Not `or`: a MultiKernelManager with no kernels yet is falsy (it defines __len__).
        owner = getattr(self.parent, "parent", None)
        return owner if owner is not None else asyncio.get_running_loop()

    def _restarting(self, restart: bool) -> bool:
        return restart or self._restart_requested

    async def _submit(self, group: GroupSpec, env: dict[str, str]) -> KernelTracker:
        assert self._backend is not None
        if self._tracker is not None:
            await self._tracker.aclose()
        group = spec.with_env(group, env, (self.kernel_spec.env or {}) if self.kernel_spec else {})
        ref = await self._backend.submit(group)
        self._tracker = self._track(ref, queue=group.queue)
        self._tracker.start()
        return self._tracker

    def _track(self, ref: GroupRef, *, queue: str) -> KernelTracker:
        assert self._backend is not None
        return KernelTracker(self._backend, ref, queue=queue, notify=self._on_change)

    def _sees_restarts(self) -> bool:
        return self._backend is None or self._backend.tracks_kernel_restarts

    async def _stop(self, grace: float, cause: StopCause) -> None:
        if self._tracker is not None and self._backend is not None:
            await self._backend.stop(self._tracker.ref, grace=grace, cause=cause)

    async def _release(self) -> None:
        """Release the group; the tracker is dropped only once that succeeded, so a release
        that failed is tried again by the next `cleanup`."""
        tracker = self._tracker
        if tracker is None:
            return
        await tracker.release()
        await tracker.aclose()
        if self._tracker is tracker:
            self._tracker = None

    def _message(self) -> str:
        tracker = self._tracker
        if tracker is None or self._spec is None:
            return ""
        return tracker.describe(needs=self._spec.needs(), restored=self._spec.checkpoint.enabled)

    def _on_change(self, state: Lifecycle, status: GroupStatus) -> None:
        """Tell the user: `reason` while not live, a status event, `last_activity` while waiting."""
        message = self._message()
        if message == self._last_message:
            return
        self._last_message = message
        km = self.parent
        who = short_id(self.kernel_id or "")
        self.log.info("kernel %s: %s", who, message)
        if km is None:
            return
        if hasattr(km, "reason"):
            km.reason = "" if state.state in lifecycle.LIVE else message
        if state.state in lifecycle.WAITING or state.state is KernelState.ADMITTED:
            km.last_activity = datetime.datetime.now(datetime.UTC)
        logger = getattr(km, "event_logger", None)
        if logger is not None and events.SCHEMA_ID in logger.schemas.schema_ids:
            data = self.queue_status()
            if data is not None:
                logger.emit(schema_id=events.SCHEMA_ID, data=data)


__all__ = ["QueuedKernelProvisioner"]
