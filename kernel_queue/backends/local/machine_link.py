"""The local backend's line to the machine's queue service: one connection, one follower a group.

The service (`kernel_queue.machine`) decides for every local backend of this user on this
machine who runs, who waits and who is preempted. `MachineLink` connects on first use (starting
the service if none answers), submits a group, and turns what the service then says of it into
calls on the backend's `Handler`: a place in line, an admission with its GPUs, a preemption, or
the end of its lease. Releases and requeues are sent in the order asked, from tasks the backend
owns, so a synchronous path (a launcher's exit) can send them too.

When the connection ends (the service exited or restarts), the kernels keep running: the link
connects again (starting a user's service if none answers) and tells the service what it holds
(`Handler.held`: running groups with their GPUs, which it takes back, and waiting ones, queued
again); only a service that does not come back within `RECONNECT_SECONDS` ends the leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from kernel_queue import errors
from kernel_queue.backends import tasks
from kernel_queue.backends.local import quota
from kernel_queue.machine import client, protocol

Log = logging.Logger | logging.LoggerAdapter[Any]


NOT_CONNECTED: dict[str, Any] = {
    "service": None,
    "gpus": [],
    "gpus_in_use": 0,
    "kernels": [],
    "hidden": {},
}
"""The machine queue's listing where no service is connected (nothing queued here yet)."""


RECONNECT_SECONDS = 20.0
"""How long a link tries to reach a service that went away before the leases end (a restart by
systemd takes a second or two; a service restarted later has freed them anyway)."""


class Handler(Protocol):
    """What the backend does with the service's word about group `name`."""

    def held(self) -> list[tuple[protocol.Submit, tuple[str, ...] | None]]:
        """Every group to tell a service that restarted, in queue order: with the GPUs it
        runs on, or None for one that waits."""
        ...

    def placed(self, name: str, place: protocol.Position) -> None: ...

    def admitted(self, name: str, devices: tuple[str, ...]) -> None: ...

    def preempted(self, name: str, message: str) -> None: ...

    def lost(self, name: str, message: str) -> None: ...


class MachineLink:
    """The backend's connection to the machine queue, (re)made when a submit needs it."""

    def __init__(self, handler: Handler, owned: tasks.Tasks, log: Log) -> None:
        self._handler = handler
        self._tasks = owned
        self.log = log
        self._client: client.MachineClient | None = None
        self._lock = asyncio.Lock()
        self._quota: protocol.Quota | None = None  # the last one connected with
        self._reconnecting: asyncio.Task[None] | None = None

    @property
    def service(self) -> protocol.Welcome | None:
        """The running service's welcome (version, pid, quota in force), once connected."""
        return None if self._client is None else self._client.service

    def enforced(self) -> quota.LocalQuota | None:
        """The quota a system service enforces for everyone (its config's), once connected to
        one; None for a user's own service (it enforces this server's settings)."""
        service = self.service
        if service is None or not service.system or service.quota is None:
            return None
        return quota.LocalQuota.enforced(service.quota)

    async def connect(self, quota: protocol.Quota) -> client.MachineClient:
        """The live connection, made (and the service started) if there is none; LaunchFailed
        or ConfigError saying what to do when the service refuses this server."""
        self._quota = quota
        async with self._lock:
            machine = self._client
            if machine is not None and machine.closed.is_set():
                self._client = None
                await machine.aclose()  # the service went away: its socket closes here
                machine = None
            if machine is None:
                machine = await client.MachineClient.connect(quota)
                self._client = machine
                self.log.info(
                    "kernel-queue: queueing through the machine's service (pid %d, version %s)",
                    machine.service.pid,
                    machine.service.version,
                )
            return machine

    async def submit(self, submit: protocol.Submit, quota: protocol.Quota) -> None:
        """Queue the group and carry out the service's first word on it (its place, or its
        admission) before returning, as a queue inside this process would; then follow the
        rest until it is released."""
        machine = await self.connect(quota)
        await machine.submit(submit)
        messages = machine.messages(submit.group)
        try:
            async with asyncio.timeout(client.START_WITHIN):
                first = await anext(messages, None)
        except TimeoutError:
            raise errors.LaunchFailed(
                f"the machine's kernel-queue service (pid {machine.service.pid}) did not answer "
                f"within {client.START_WITHIN:.0f} s; see "
                f"{client.socket_path().with_name('queue.log')}"
            ) from None
        if first is not None:
            self._carry_out(submit.group, first)
        self._tasks.spawn(self._follow(submit.group, messages), f"queue {submit.group}")

    def resubmit(self, submit: protocol.Submit, quota: protocol.Quota) -> None:
        """Queue a group again (woken from parked), after whatever was sent before; a service
        that cannot be reached ends the group through `Handler.lost`."""

        async def again() -> None:
            try:
                await self.submit(submit, quota)
            except (errors.KernelQueueError, OSError) as exc:
                self._handler.lost(submit.group, str(exc))

        self._tasks.spawn(again(), f"requeue {submit.group}")

    async def _follow(self, name: str, messages: AsyncIterator[protocol.Message]) -> None:
        async for message in messages:
            self._carry_out(name, message)

    def _carry_out(self, name: str, message: protocol.Message) -> None:
        handler = self._handler
        if isinstance(message, protocol.Position):  # `reason`: why it waits, if not its place
            handler.placed(name, message)
        elif isinstance(message, protocol.Admit):
            handler.admitted(name, message.devices)
        elif isinstance(message, protocol.Preempt):
            handler.preempted(name, message.message)
        elif isinstance(message, protocol.Refused):
            handler.lost(name, message.message)
        elif isinstance(message, client.Gone):
            self._reconnect_soon(message.message)

    def _reconnect_soon(self, why: str) -> None:
        """The connection ended: connect again and take the leases back (once for all
        groups)."""
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = self._tasks.spawn(self._reconnect(why), "reconnect")

    async def _reconnect(self, why: str) -> None:
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + RECONNECT_SECONDS, 0.05
        self.log.warning("kernel-queue: %s; connecting again, its kernels keep running", why)
        assert self._quota is not None
        while True:
            try:
                machine = await self.connect(self._quota)
                break
            except (errors.KernelQueueError, OSError) as exc:
                if loop.time() + delay > deadline:
                    message = (
                        f"{why}, and no service answered within {RECONNECT_SECONDS:g} s "
                        f"({exc}); the group's lease ended"
                    )
                    for submit, _ in self._handler.held():
                        self._handler.lost(submit.group, message)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        held = self._handler.held()
        self.log.info(
            "kernel-queue: the machine's service (pid %d) is back; %d of this server's kernels "
            "told to it",
            machine.service.pid,
            len(held),
        )
        for submit, devices in held:
            await machine.submit(dataclasses.replace(submit, holds=devices))
            messages = machine.messages(submit.group)
            self._tasks.spawn(self._follow(submit.group, messages), f"queue {submit.group}")

    async def queue(self, *, here: set[str]) -> dict[str, Any]:
        """The machine's whole queue as the service lists it (every server's and batch run's
        kernels of this user), `here` marking the kernel ids of this server; no service and
        no kernels when not connected (this server queued nothing yet, or the service went
        away): a look never starts a service."""
        machine = self._client
        listing = None
        if machine is not None and not machine.closed.is_set():
            with contextlib.suppress(errors.LaunchFailed):
                listing = await machine.listing()
        if machine is None or listing is None:
            return dict(NOT_CONNECTED)
        service = machine.service
        return {
            "service": {"pid": service.pid, "version": service.version, "system": service.system},
            "gpus": [] if service.quota is None else list(service.quota.gpus),
            "gpus_in_use": listing.gpus_in_use,
            "kernels": [
                {
                    **dataclasses.asdict(entry),
                    "here": bool(entry.kernel_id) and entry.kernel_id in here,
                }
                for entry in listing.groups
            ],
            "hidden": dict(listing.hidden),  # other users' kernels by state, when only counted
        }

    def release(self, name: str) -> None:
        """Leave the queue or give back the GPUs (sent now, in order)."""
        self._tell(lambda machine: machine.release(name), f"release {name}")

    def requeue(self, name: str) -> None:
        """The preempted kernel stopped: its GPUs back, the group at the end of its queue."""
        self._tell(lambda machine: machine.requeue(name), f"requeue {name}")

    def _tell(self, send: Callable[[client.MachineClient], Awaitable[None]], what: str) -> None:
        machine = self._client
        if machine is None or machine.closed.is_set():
            return  # no service, no lease: nothing to give back

        async def told() -> None:
            try:
                await send(machine)
            except (errors.LaunchFailed, ConnectionError) as exc:
                self.log.debug("kernel-queue: %s not sent: %s", what, exc)

        self._tasks.spawn(told(), what)

    async def aclose(self) -> None:
        """End the connection (the service releases whatever this backend still held)."""
        machine, self._client = self._client, None
        if machine is not None:
            await machine.aclose()
