"""Idle parking in the Jupyter server: park kernels idle past `park_after`, wake them on a cell.

`IdleParker` belongs to the server's kernel manager. ONE periodic scan for the whole server
(never a loop per kernel) parks a kernel that runs, reads `idle`, and for `park_after` seconds
had no IOPub message (`last_activity`, which jupyter_server refreshes on every kernel message,
so streaming output counts) and no client message (`client_message`, called by
`connection.QueuedWebsocketConnection`). While a kernel is parked, or parking, or waking,
client messages are held here in order; the first `execute_request` wakes the kernel
(`KernelSession.resume`) and once it has left the parked state (the old process is gone, the new one
is queued) the held messages go on to ZMQ, which keeps them until the new kernel binds.

Idle time is read on the parker's `clock` (`time.monotonic`): a client message is stamped with
it, and jupyter_server's `last_activity` (a wall-clock time) is placed on it once, at its age when
the scan first sees it. A test gives the parker a virtual clock and lets idle time pass at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import time
from collections.abc import Callable
from typing import Any

from kernel_queue import errors, jupyter_privates
from kernel_queue.model import short_id
from kernel_queue.server import kernels
from kernel_queue.session import KernelSession

MIN_INTERVAL = 1.0
"""The scan's shortest period (s): a tenth of the smallest `park_after`, but never below this."""
MAX_INTERVAL = 30.0
"""And never above this, so a long `park_after` is still honoured to within 30 s."""
EVERY = 0.05
"""How often a kernel whose provisioner tells no changes is looked at again (s; a local check)."""
WAKE_LIMIT = 600.0
"""How long a wake waits for the kernel to leave the parked state before sending on regardless."""
SHOWN_LIMIT = 10.0
"""How long a park waits for the backend to report the kernel parking (it does at once)."""
HELD_LIMIT = 1000
"""Client messages held per parked kernel at most; more are dropped (and logged)."""
LIVE_STATES = frozenset({"running", "resumed"})
QUIET_STATES = frozenset({"idle", "starting"})
"""jupyter_server's execution states of a kernel that runs no cell: it reads "starting" until a
status reaches its activity watcher, which for a kernel no client ever spoke to is never."""

Clock = Callable[[], float]
"""The time in seconds on a monotonic scale, as the parker reads it (`time.monotonic`)."""
Forward = Callable[[Any], None]
"""Send one held client message on to the kernel through the connection that received it."""


def park_after(km: Any) -> float:
    """The kernel's `park_after` (s); 0 for kernels that never park."""
    return kernels.park_after(km)


def is_parked(km: Any) -> bool:
    """True while the kernel is parked, or stopping to park (as users see it)."""
    session = kernels.session_of(km)
    return session is not None and session.parked


def is_live(km: Any) -> bool:
    """The kernel runs: its launch ended well and its queue state is running or resumed."""
    session = kernels.session_of(km)
    ready = km.ready
    if session is None or not ready.done() or ready.cancelled():
        return False
    if ready.exception() is not None or session.tracker is None:
        return False
    if session.waiting or session.parked:
        return False
    status = session.queue_status()
    return status is not None and status.get("state") in LIVE_STATES


async def changed(km: Any) -> None:
    """Return at the kernel's next change of state (its session's `wait_changed`), or after
    `EVERY` s for a kernel with nothing submitted (or not queued)."""
    session = kernels.session_of(km)
    if session is not None and session.tracker is not None:
        await session.wait_changed()
    else:
        await asyncio.sleep(EVERY)


def _session_to_park(kernel_id: str, km: Any) -> KernelSession:
    """The kernel's session, or `ParkRefused` saying why there is none to park."""
    session = kernels.session_of(km)
    if session is not None:
        return session
    if kernels.provisioner_of(km) is None:
        raise errors.ParkRefused(f"kernel {kernel_id} is not a queued kernel: it cannot be parked")
    raise errors.ParkRefused(
        f"kernel {short_id(kernel_id)} has not started: only a running kernel can be parked"
    )


def parker_of(manager: Any) -> IdleParker | None:
    """The server's kernel manager's parker; None under a kernel manager that does not park."""
    parker = getattr(manager, "parker", None)
    return parker if isinstance(parker, IdleParker) else None


def _seen(task: asyncio.Task[None]) -> None:
    """Mark a park's outcome as retrieved (its error was logged or answered already)."""
    if not task.cancelled():
        task.exception()


class IdleParker:
    """Parks idle kernels and wakes parked ones for the server's kernel manager `manager`."""

    def __init__(self, manager: Any, clock: Clock = time.monotonic) -> None:
        self.manager = manager
        self.clock = clock
        """What the parker reads the time from, for every idle time it measures."""
        self._scan: asyncio.Task[None] | None = None
        self._client: dict[str, float] = {}  # kernel id -> `clock` at its latest client message
        # kernel id -> jupyter_server's `last_activity` as last seen, and that moment on `clock`
        self._activity: dict[str, tuple[datetime.datetime, float]] = {}
        self._parking: dict[str, asyncio.Task[None]] = {}
        self._waking: dict[str, asyncio.Task[None]] = {}
        self._held: dict[str, list[tuple[Forward, Any]]] = {}

    @property
    def log(self) -> Any:
        return self.manager.log

    def _managers(self) -> dict[str, Any]:
        """The server's kernel managers by kernel id, pending kernels included."""
        return jupyter_privates.kernels(self.manager)

    # -- the periodic scan -------------------------------------------------------------------

    @property
    def scanning(self) -> bool:
        return self._scan is not None and not self._scan.done()

    def start(self) -> None:
        """Start the scan (idempotent): called when a kernel with `park_after > 0` starts."""
        if not self.scanning:
            self._scan = asyncio.get_running_loop().create_task(self._run())
            self.log.info("kernel-queue: parking kernels idle past their park_after")

    async def stop(self) -> None:
        """Stop the scan and any park or wake in progress (server shutdown: the kernels are
        shut down next, parked or not)."""
        tasks = [t for t in (self._scan, *self._parking.values(), *self._waking.values()) if t]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._scan = None
        self._held.clear()

    def interval(self) -> float:
        """A tenth of the smallest `park_after` among the kernels, within 1 s and 30 s."""
        afters = [a for km in list(self._managers().values()) if (a := park_after(km)) > 0]
        return min(MAX_INTERVAL, max(MIN_INTERVAL, min(afters, default=MAX_INTERVAL * 10) / 10))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval())
            try:
                self.scan()
            except Exception:  # one bad kernel must not end parking for every other
                self.log.exception("kernel-queue: the idle-parking scan failed")

    def scan(self) -> list[str]:
        """Start parking every kernel idle past its `park_after`; return their ids."""
        due = []
        for kernel_id, km in list(self._managers().items()):
            if self.idle_for(kernel_id) is not None:
                # The reason names the setting ("parked after 30 min idle"), not the scan's
                # lateness (up to one interval more).
                self.park(kernel_id, idle_seconds=park_after(km))
                due.append(kernel_id)
        return due

    def idle_for(self, kernel_id: str) -> float | None:
        """Seconds the kernel has been idle if that is at least its `park_after`, else None."""
        km = self._managers().get(kernel_id)
        after = park_after(km)
        if km is None or after <= 0 or self.busy_here(kernel_id):
            return None
        if not is_live(km):
            # Waiting in its queue (woken, preempted) is not idleness: once it runs again it
            # gets its whole park_after, however long it waited.
            self._client[kernel_id] = self.clock()
            return None
        if km.execution_state not in QUIET_STATES:
            return None  # a cell runs (or the kernel restarts): never park it
        last = km.last_activity
        if not isinstance(last, datetime.datetime):
            return None
        now = self.clock()
        active = max(self._active_at(kernel_id, last, now), self._client.get(kernel_id, -math.inf))
        idle = now - active
        return idle if idle >= after else None

    def _active_at(self, kernel_id: str, last: datetime.datetime, now: float) -> float:
        """When, on `clock`, the kernel's latest IOPub message came: jupyter_server's
        `last_activity` (wall-clock time), placed at its age when first seen (`now`)."""
        seen = self._activity.get(kernel_id)
        if seen is None or seen[0] != last:
            age = (datetime.datetime.now(datetime.UTC) - last).total_seconds()
            seen = self._activity[kernel_id] = (last, now - age)
        return seen[1]

    def busy_here(self, kernel_id: str) -> bool:
        """A park or a wake of this kernel is in progress, or client messages wait for it."""
        return kernel_id in self._parking or kernel_id in self._waking or kernel_id in self._held

    # -- client messages ---------------------------------------------------------------------

    def client_message(self, kernel_id: str) -> None:
        """A client sent the kernel a message: its idle time starts again."""
        self._client[kernel_id] = self.clock()

    def holding(self, kernel_id: str) -> bool:
        """Whether a client message for this kernel must be held rather than sent on now."""
        km = self._managers().get(kernel_id)
        return km is not None and (self.busy_here(kernel_id) or is_parked(km))

    def answers_for(self, kernel_id: str) -> bool:
        """Whether the server answers a kernel_info_request itself: the kernel is parked (or
        parking) and nothing is held before it, so the answer keeps the order of replies."""
        km = self._managers().get(kernel_id)
        parked = km is not None and (is_parked(km) or kernel_id in self._parking)
        return parked and kernel_id not in self._held and kernel_id not in self._waking

    def hold(self, kernel_id: str, forward: Forward, message: Any, *, wakes: bool) -> None:
        """Keep `message` until the kernel is back; `wakes`: it is a cell, so wake the kernel."""
        held = self._held.setdefault(kernel_id, [])
        if len(held) >= HELD_LIMIT:
            self.log.warning("kernel %s is parked: dropped a client message (too many)", kernel_id)
        else:
            held.append((forward, message))
        if wakes:
            self.wake(kernel_id)

    # -- parking and waking ------------------------------------------------------------------

    def park(self, kernel_id: str, *, idle_seconds: float | None = None) -> asyncio.Task[None]:
        """Park the kernel now (or join the park in progress). Asked for (`idle_seconds` None)
        its task raises `ParkRefused` with the reason; the scan's parks only log theirs."""
        task = self._parking.get(kernel_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._park(kernel_id, idle_seconds))
            task.add_done_callback(_seen)  # whoever asked may have stopped waiting for it
            self._parking[kernel_id] = task
        return task

    async def _park(self, kernel_id: str, idle_seconds: float | None) -> None:
        km = self._managers().get(kernel_id)
        try:
            if km is None:
                raise errors.ParkRefused(f"kernel {kernel_id} is gone: there is nothing to park")
            if km.execution_state == "busy":
                # Parking stops the kernel: a cell it runs would be cut short.
                raise errors.ParkRefused(
                    f"kernel {kernel_id} is running a cell: park it once the cell has finished"
                )
            await _session_to_park(kernel_id, km).park(idle_seconds=idle_seconds)
            # The backend reports PARKING a moment later; until then a client message could
            # still reach the kernel that is stopping, so it is held meanwhile.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHOWN_LIMIT):
                    while kernel_id in self._managers() and not is_parked(km):
                        await changed(km)
        except errors.ParkRefused as exc:
            if idle_seconds is None:
                raise  # asked for (REST, CLI, the panel): the refusal is the answer
            self.log.info("kernel %s not parked: %s", kernel_id, exc)
        except Exception:
            self.log.exception("kernel %s: parking failed", kernel_id)
            if idle_seconds is None:
                raise
        finally:
            self._parking.pop(kernel_id, None)
            if km is not None and not is_parked(km) and kernel_id not in self._waking:
                self.flush(kernel_id)  # not parked after all: what came meanwhile goes on

    def wake(self, kernel_id: str) -> asyncio.Task[None]:
        """Wake the kernel (or join the wake in progress); held messages go on once it is back."""
        task = self._waking.get(kernel_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._wake(kernel_id))
            self._waking[kernel_id] = task
        return task

    async def _wake(self, kernel_id: str) -> None:
        try:
            parking = self._parking.get(kernel_id)
            if parking is not None:  # a resume during a park takes effect once it is parked
                await asyncio.wait({parking})
            km = self._managers().get(kernel_id)
            session = kernels.session_of(km)
            if km is not None and session is not None and session.parked:
                await session.resume()
                self.client_message(kernel_id)  # woken: its idle time starts now
                # Until the kernel has left the parked state its old process may still be
                # saving: a message sent now could reach it and be lost with it.
                async with asyncio.timeout(WAKE_LIMIT):
                    while kernel_id in self._managers() and is_parked(km):
                        await changed(km)
        except Exception:
            self.log.exception("kernel %s: waking it failed", kernel_id)
        finally:
            self._waking.pop(kernel_id, None)
            self.flush(kernel_id)

    def flush(self, kernel_id: str) -> None:
        """Send the held client messages on, in the order they came."""
        for forward, message in self._held.pop(kernel_id, []):
            try:
                forward(message)
            except Exception:  # one client's broken message must not keep the others'
                self.log.exception("kernel %s: a held client message was lost", kernel_id)

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone: drop what was kept for it."""
        self._client.pop(kernel_id, None)
        self._activity.pop(kernel_id, None)
        self._held.pop(kernel_id, None)
