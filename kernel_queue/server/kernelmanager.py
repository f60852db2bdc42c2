"""`QueuedMappingKernelManager`: jupyter_server's kernel manager, aware of queued kernels.

jupyter_server waits for a pending kernel's launch before shutting it down, so deleting a kernel
that waits in a queue would wait for its admission. This subclass first asks the provisioner to
cancel the wait (the launch then fails at once; a shutdown that goes on before it ended leaves the
start's future to the start), never culls a kernel that is waiting, answers an
interrupt or a restart of a waiting kernel by leaving it queued, marks a kernel whose launch
failed as dead with the error as its `reason`, and logs a failed start once (`OnceFilter`).
It parks idle kernels (`parking.IdleParker`, started with the first kernel whose `park_after`
is set) and leaves a parked kernel alone when asked to interrupt it.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import functools
import logging
from typing import Any

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from traitlets import TraitError

from kernel_queue import backends, errors, events, jupyter_privates
from kernel_queue.server import connection, kernels, parking

# How long shutdown waits for a cancelled launch to end before going on regardless.
_CANCEL_WAIT_SECONDS = 5.0
# How many 10 ms steps shutdown waits for a just-started kernel's provisioner to be made.
_PROVISIONER_WAIT_STEPS = 100
# How long server shutdown waits for kernels to stop (jupyter_client needs about 10 s at most).
_SHUTDOWN_ALL_WAIT_SECONDS = 30.0

_TRACEBACK = "kernel_queue_traceback"
"""Marks the DEBUG record that carries a failed start's traceback (`OnceFilter` lets it pass)."""


class OnceFilter(logging.Filter):
    """jupyter_client and jupyter_server log a failed start three times, each with a traceback.
    For our own errors (already a sentence) the first record is kept, without the traceback:
    INFO for a cancelled launch (an ordinary shutdown of a queued kernel), else ERROR, with the
    traceback in a DEBUG record after it; the others are dropped. Records of any other error
    pass unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: collections.deque[BaseException] = collections.deque(maxlen=256)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, errors.KernelQueueError) or getattr(record, _TRACEBACK, False):
            return True
        if any(error is seen for seen in self._seen):
            return False
        self._seen.append(error)
        cancelled = isinstance(error, errors.LaunchCancelled)
        record.levelno = logging.INFO if cancelled else logging.ERROR
        record.levelname = logging.getLevelName(record.levelno)
        record.msg, record.args = ("%s" if cancelled else "kernel start failed: %s"), (error,)
        exc_info, record.exc_info, record.exc_text = record.exc_info, None, None
        logger = logging.getLogger(record.name)
        if not cancelled and logger.isEnabledFor(logging.DEBUG):
            debug = functools.partial(
                logger.debug,
                "the failed start's traceback",
                exc_info=exc_info,
                extra={_TRACEBACK: True},
            )
            try:  # after the ERROR line: a filter runs before its own record is handled
                asyncio.get_running_loop().call_soon(debug)
            except RuntimeError:
                debug()
        return True


class QueuedMappingKernelManager(AsyncMappingKernelManager):
    """Cancels queued launches on shutdown, keeps the culler away from waiting kernels, and
    parks idle kernels."""

    parks_idle_kernels = True
    """Read by the provisioner: a kernelspec's `park_after` works under this manager."""

    def __bool__(self) -> bool:
        """Always true, even with no kernels (MultiKernelManager's `__len__` made it false):
        jupyter_server's cleanup skips `shutdown_all` for a false kernel manager, so a server
        stopped with no kernel left its backends open (the machine queue's connection, the
        cluster's watches) for as long as the process lived."""
        return True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parker = parking.IdleParker(self)
        logger = getattr(self.log, "logger", self.log)  # a LoggerAdapter's logger
        if not any(isinstance(f, OnceFilter) for f in logger.filters):
            logger.addFilter(OnceFilter())

    async def start_kernel(  # type: ignore[override]
        self, *, kernel_name: Any = None, **kwargs: Any
    ) -> str:
        """Refuse a kernel name that is not a string (400) or names no kernelspec (404) before
        anything starts: with pending kernels the base class answered 201 and failed later, or
        500 for a name that is not a string."""
        if kernel_name is not None:
            if not isinstance(kernel_name, str) or not kernel_name:
                raise web.HTTPError(
                    400,
                    f"a kernel's name must be a kernelspec's name (a string), not {kernel_name!r}",
                )
            from jupyter_client.kernelspec import NoSuchKernel

            try:
                self.kernel_spec_manager.get_kernel_spec(kernel_name)  # type: ignore[union-attr]
            except NoSuchKernel:
                raise web.HTTPError(
                    404,
                    f"no kernelspec named {kernel_name!r}: `jupyter kernelspec list` shows those "
                    "there are",
                ) from None
        kernel_id: str = await super().start_kernel(kernel_name=kernel_name, **kwargs)
        return kernel_id

    async def _async_shutdown_kernel(
        self, kernel_id: str, now: bool | None = False, restart: bool | None = False
    ) -> Any:
        km = jupyter_privates.kernels(self).get(kernel_id)
        pending = jupyter_privates.pending(self)
        if km is None and kernel_id in pending:
            # Already shutting down (pending kernels return from DELETE at once): wait for it.
            await asyncio.wait({pending[kernel_id]})
            return None
        known = km is not None or self._stopping_all  # shutdown_all lists ids, then calls here
        if not restart:
            self.parker.forget(kernel_id)
        if km is not None and not km.ready.done():
            await self._cancel_start(km)
        try:
            return await super()._async_shutdown_kernel(kernel_id, now=now, restart=restart)
        except web.HTTPError as exc:
            # Another shutdown of the same kernel (a DELETE, shutdown_all) ended first while
            # this one waited: the kernel is gone, as asked. An unknown id is still a 404.
            if known and exc.status_code == 404 and kernel_id not in jupyter_privates.kernels(self):
                return None
            raise

    shutdown_kernel = _async_shutdown_kernel  # type: ignore[assignment]

    async def _cancel_start(self, km: Any) -> None:
        """Cancel a queued kernel's start, whichever step it is at, and wait (bounded) for it
        to end; jupyter's own shutdown would wait for the start, that is for the admission."""
        # The start task makes the provisioner in its first step, which a DELETE sent right
        # after the POST can overtake.
        for _ in range(_PROVISIONER_WAIT_STEPS):
            if km.provisioner is not None or km.ready.done():
                break
            await asyncio.sleep(0.01)
        provisioner = kernels.provisioner_of(km)
        if provisioner is not None:  # else a kernel of another provisioner: jupyter waits for it
            await provisioner.cancel_launch()
            await asyncio.wait({km.ready}, timeout=_CANCEL_WAIT_SECONDS)

    _stopping_all = False

    async def _async_shutdown_all(self, now: bool = False) -> None:
        self._stopping_all = True
        await self.parker.stop()
        try:
            await super()._async_shutdown_all(now=now)
        finally:
            self._stopping_all = False
        # With pending kernels the base class starts each shutdown without waiting for it; wait,
        # so the server exits only once launchers are stopped and connection files removed.
        stopping = [task for task in jupyter_privates.pending(self).values() if not task.done()]
        if stopping:
            await asyncio.wait(stopping, timeout=_SHUTDOWN_ALL_WAIT_SECONDS)
        await backends.aclose_all(self)  # the backends this server's kernels shared

    shutdown_all = _async_shutdown_all  # type: ignore[assignment]

    async def _finish_kernel_start(self, kernel_id: str) -> None:
        # jupyter_server marks a failed pending launch dead only when a websocket connects;
        # mark it here so the REST API and `jupyter kernel-queue status` show the error too.
        km: Any = self.get_kernel(kernel_id)
        # jupyter_server cancels this task when the kernel is shut down before its start
        # ended (`_cancel_start` waits only so long). The base class awaits the start's future
        # itself, so that cancel cancelled the future: the start's own end then found it
        # cancelled (InvalidStateError logged) and jupyter_client shut down a kernel that had
        # never started. Waiting on it leaves the future to the start.
        started = km.ready
        if not isinstance(started, asyncio.Future):
            started = asyncio.wrap_future(started)
        await asyncio.wait({started})
        await super()._finish_kernel_start(kernel_id)
        ready = km.ready
        if parking.park_after(km) > 0:
            self.parker.start()
        if ready.done() and not ready.cancelled() and ready.exception() is not None:
            km.execution_state = "dead"
            km.reason = str(ready.exception())
            if km.provisioner is None:
                self._refused(kernel_id, km, ready.exception())
            # A start can fail after launch_kernel returned (jupyter_client writing the
            # connection file, say): jupyter then forgets the kernel without the provisioner's
            # cleanup, so release its group here (a no-op when the launch released it).
            session = kernels.session_of(km)
            if session is not None and session.tracker is not None:
                try:
                    await session.release()
                except Exception as exc:
                    self.log.warning("kernel %s: release after a failed start: %s", kernel_id, exc)

    def _refused(self, kernel_id: str, km: Any, error: BaseException) -> None:
        """A queued kernelspec whose config our provisioner refused as it was made (a key of
        the wrong type): listed and told as a failed kernel, as one refused later is."""
        try:
            metadata = km.kernel_spec.metadata or {}
        except Exception:  # no such kernelspec: jupyter's own error says so
            return
        provisioner = metadata.get("kernel_provisioner") or {}
        if provisioner.get("provisioner_name") != connection.QUEUED_PROVISIONER:
            return
        config = provisioner.get("config") or {}
        if isinstance(error, TraitError):  # a key's value of the wrong type (`options.py`)
            error = errors.ConfigError(str(error))
        refusal = events.refused_payload(kernel_id, config, error)
        kernels.refused(km, refusal)
        logger = km.event_logger
        if logger is not None and events.SCHEMA_ID in logger.schemas.schema_ids:
            logger.emit(schema_id=events.SCHEMA_ID, data=refusal)

    def _waiting(self, kernel_id: str) -> bool:
        session = kernels.session_of(jupyter_privates.kernels(self).get(kernel_id))
        return session is not None and session.waiting

    def interrupt_kernel(self, kernel_id: str) -> Any:
        # A kernel waiting in its queue runs no code: there is nothing to interrupt (jupyter
        # would refuse a pending kernel with an HTTP 500).
        if self._waiting(kernel_id):
            self.log.info("kernel %s waits in its queue: nothing to interrupt", kernel_id)
            return None
        km = jupyter_privates.kernels(self).get(kernel_id)
        if km is not None and parking.is_parked(km):
            self.log.info("kernel %s is parked: nothing to interrupt", kernel_id)
            return None
        return super().interrupt_kernel(kernel_id)

    async def restart_kernel(self, kernel_id: str, now: bool = False) -> Any:  # type: ignore[override]
        # A kernel waiting in its queue keeps its place: it starts afresh once admitted (jupyter
        # would refuse a pending kernel with an HTTP 500, or wait for the admission).
        if self._waiting(kernel_id):
            self.log.info("kernel %s waits in its queue: it stays queued", kernel_id)
            return None
        return await super().restart_kernel(kernel_id, now=now)

    async def cull_kernel_if_idle(self, kernel_id: str) -> Any:
        km = jupyter_privates.kernels(self).get(kernel_id)
        if km is not None and self._waiting(kernel_id):
            km.last_activity = datetime.datetime.now(datetime.UTC)
            self.log.debug("not culling kernel %s: it waits in a queue", kernel_id)
            return None
        return await super().cull_kernel_if_idle(kernel_id)
