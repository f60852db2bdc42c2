"""The machine's queue service: one process per machine and user owning the local queue.

Every client (a local backend in any Jupyter server, nbconvert or papermill process) connects
to one Unix socket, says `hello` with the quota it would use and submits its groups; the
service runs `admission.schedule` over all of them on every change, as `LocalBackend._schedule`
does inside one server, and tells each client its groups' positions, admissions and
preemptions. An admitted group is a lease held by its client's connection: when the
connection ends (EOF, a SIGKILLed client) its groups are gone at once. A preempted group's GPUs
come back after its grace seconds whether or not its client answered. The service exits
`IDLE_EXIT_SECONDS` after the last client left. Stdlib and `admission` only: it must stay small.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernel_queue import admission
from kernel_queue.machine import protocol

IDLE_EXIT_SECONDS = 3.0
"""How long the service outlives its last client (a server restarting finds it still there)."""

log = logging.getLogger("kernel_queue.machine")


class AlreadyRunning(RuntimeError):
    """Another service answers on the socket: this one has nothing to do."""


@dataclass(eq=False)
class _Client:
    writer: asyncio.StreamWriter
    pid: int  # the peer's, from SO_PEERCRED: the seam for the multi-user mode
    uid: int
    greeted: bool = False
    groups: set[str] = field(default_factory=set)

    def send(self, message: protocol.Message) -> None:
        if not self.writer.is_closing():
            self.writer.write(protocol.encode(message))


@dataclass(eq=False)
class _Group:
    submit: protocol.Submit
    client: _Client
    request: admission.Request
    admitted: admission.Admitted | None = None
    devices: tuple[str, ...] = ()
    evicting: bool = False
    reclaim: asyncio.TimerHandle | None = None
    shown: protocol.Position | None = None  # the last place told, so only changes are sent


def bind(path: Path) -> socket.socket:
    """The service's listening socket at `path`, in a 0700 directory, itself 0600; a stale
    socket file (no service answers) is replaced, a live one raises AlreadyRunning."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if path.is_socket() or path.is_symlink():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except (ConnectionRefusedError, FileNotFoundError):
                log.info("replacing the stale socket %s", path)
                path.unlink(missing_ok=True)
            else:
                raise AlreadyRunning(f"a kernel-queue service already answers on {path}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(umask)
    os.chmod(path, 0o600)
    listener.listen(128)
    return listener


def peer(writer: asyncio.StreamWriter) -> tuple[int, int]:
    """The connected client's pid and uid, as the kernel reports them (SO_PEERCRED)."""
    sock = writer.get_extra_info("socket")
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


class Service:
    """The queue of one machine and user, served on `path` until idle."""

    def __init__(self, path: Path, version: str, idle_exit: float = IDLE_EXIT_SECONDS) -> None:
        self.path = path
        self.version = version
        self.idle_exit = idle_exit
        self.quota: protocol.Quota | None = None
        self._clients: set[_Client] = set()
        self._groups: dict[str, _Group] = {}
        self._arrivals = itertools.count()
        self._done = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None
        self._pass: asyncio.Handle | None = None

    async def serve(self) -> None:
        """Bind, serve clients, return once no client came for `idle_exit` seconds or on
        SIGTERM; the socket file is removed if it is still this service's."""
        listener = bind(self.path)
        inode = os.stat(self.path).st_ino
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._done.set)
        server = await asyncio.start_unix_server(self._connection, sock=listener)
        log.info("kernel-queue service %s (pid %d) on %s", self.version, os.getpid(), self.path)
        self._arm_idle()
        try:
            await self._done.wait()
        finally:
            server.close()
            for client in list(self._clients):
                client.writer.close()
            try:
                if os.stat(self.path).st_ino == inode:
                    self.path.unlink()
            except FileNotFoundError:
                pass
            log.info("kernel-queue service (pid %d) exits", os.getpid())

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = None
        if not self._clients:
            self._idle = asyncio.get_running_loop().call_later(self.idle_exit, self._done.set)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _Client(writer, *peer(writer))
        self._clients.add(client)
        self._arm_idle()
        try:
            while line := await reader.readline():
                try:
                    message = protocol.decode(line)
                except protocol.ProtocolError as exc:
                    client.send(protocol.Refused(str(exc)))
                    break
                carry_on = self._handle(client, message)
                await writer.drain()
                if not carry_on:
                    break
        except ConnectionError:
            pass
        finally:
            self._drop(client)
            writer.close()

    def _handle(self, client: _Client, message: protocol.Message) -> bool:
        """Carry out one message; False ends the connection."""
        if isinstance(message, protocol.Hello):
            return self._greet(client, message)
        if not client.greeted:
            client.send(protocol.Refused(f"say hello first (protocol {protocol.PROTOCOL})"))
            return False
        if isinstance(message, protocol.Submit):
            self._submit(client, message)
        elif isinstance(message, protocol.Release):
            group = self._own(client, message.group)
            if group is not None:
                self._remove(group)
                self._schedule()
        elif isinstance(message, protocol.Requeue):
            group = self._own(client, message.group)
            if group is not None and group.admitted is not None:
                self._requeue(group)
                self._schedule()
        elif isinstance(message, protocol.List):
            if self._pass is not None:  # what came before the list is decided in it
                self._pass.cancel()
                self._run_pass()
            client.send(self.listing())
        else:
            client.send(protocol.Refused(f"a client does not send {message.TYPE!r}"))
        return True

    def _greet(self, client: _Client, hello: protocol.Hello) -> bool:
        if hello.protocol != protocol.PROTOCOL or hello.quota is None:
            welcome = protocol.Welcome(self.version, os.getpid(), protocol.PROTOCOL, self.quota)
            client.send(welcome)
            client.send(protocol.Refused(protocol.mismatch(welcome, hello.version, hello.protocol)))
            return False
        if not any(c.greeted for c in self._clients):
            self.quota = hello.quota  # the first client's settings hold while any client does
        assert self.quota is not None
        client.send(protocol.Welcome(self.version, os.getpid(), protocol.PROTOCOL, self.quota))
        differences = hello.quota.differences(self.quota)
        if differences:
            client.send(protocol.Refused(protocol.quota_differs(differences, os.getpid())))
            return False
        client.greeted = True
        log.info("client pid %d (uid %d, version %s) joined", client.pid, client.uid, hello.version)
        return True

    def _own(self, client: _Client, name: str) -> _Group | None:
        group = self._groups.get(name)
        return group if group is not None and group.client is client else None

    def _submit(self, client: _Client, submit: protocol.Submit) -> None:
        assert self.quota is not None
        existing = self._groups.get(submit.group)
        if existing is not None:
            if existing.client is not client:
                client.send(
                    protocol.Refused(
                        f"group {submit.group} is already queued by another client "
                        f"(pid {existing.client.pid})",
                        submit.group,
                    )
                )
            return
        if submit.queue not in self.quota.queues:
            known = ", ".join(self.quota.queues)
            client.send(
                protocol.Refused(
                    f"queue {submit.queue!r} does not exist on this machine; known queues: {known}",
                    submit.group,
                )
            )
            return
        request = admission.Request(
            name=submit.group,
            queue=submit.queue,
            resources=dict(submit.resources),
            priority=submit.priority,
            created=float(next(self._arrivals)),
        )
        unfit = admission.check_fits_ever(self.quota.cluster_queue(), request)
        if unfit is not None:
            client.send(protocol.Refused(unfit.message, submit.group))
            return
        self._groups[submit.group] = _Group(submit, client, request)
        client.groups.add(submit.group)
        self._schedule()

    def _remove(self, group: _Group) -> None:
        if group.reclaim is not None:
            group.reclaim.cancel()
        self._groups.pop(group.submit.group, None)
        group.client.groups.discard(group.submit.group)

    def _requeue(self, group: _Group) -> None:
        """Give back the group's GPUs and put it at the back of its queue."""
        if group.reclaim is not None:
            group.reclaim.cancel()
        group.reclaim = None
        group.admitted, group.devices, group.evicting, group.shown = None, (), False, None
        group.request = replace(group.request, created=float(next(self._arrivals)))

    def _drop(self, client: _Client) -> None:
        """The connection ended: its leases end with it."""
        self._clients.discard(client)
        for name in list(client.groups):
            self._remove(self._groups[name])
        self._schedule()
        if client.greeted:
            log.info("client pid %d left", client.pid)
        self._arm_idle()

    def _schedule(self) -> None:
        """Run one admission pass soon: once per loop turn, however many messages came in it
        (a pass over 200 groups is most of a submit's cost)."""
        if self._pass is None:
            self._pass = asyncio.get_running_loop().call_soon(self._run_pass)

    def _run_pass(self) -> None:
        """Run the admission engine over every client's groups and tell each client."""
        self._pass = None
        if self.quota is None or not self._groups:
            return
        groups = self._groups
        pending = [g.request for g in groups.values() if g.admitted is None]
        admitted = [replace(g.admitted, evicting=g.evicting) for g in groups.values() if g.admitted]
        decision = admission.schedule(self.quota.cluster_queue(), pending, admitted)
        for preemption in decision.preempt:
            self._evict(groups[preemption.victim], groups[preemption.preemptor])
        for grant in decision.admit:
            self._admit(groups[grant.name], grant)
        for name, position in decision.positions.items():
            group = groups[name]
            place = protocol.Position(
                name, group.request.queue, position.in_queue + 1, position.queue_length
            )
            if place != group.shown:
                group.shown = place
                group.client.send(place)

    def _admit(self, group: _Group, grant: admission.Admission) -> None:
        assert self.quota is not None
        busy = {d for g in self._groups.values() if g.admitted for d in g.devices}
        free = [d for d in self.quota.gpus if d not in busy]
        group.devices = tuple(free[: group.request.resources.get("gpu", 0)])
        group.admitted = admission.Admitted(
            group.request, grant.flavors, asyncio.get_running_loop().time()
        )
        group.shown = None
        group.client.send(protocol.Admit(group.submit.group, group.devices))

    def _evict(self, victim: _Group, preemptor: _Group) -> None:
        """Ask the holder to stop; reclaim its GPUs after its grace whatever it does."""
        klass = preemptor.submit.priority_class
        by = f"kernel {_short(preemptor.submit.kernel_id)}" + (
            f" (priority {klass!r})" if klass else ""
        )
        message = f"preempted by higher-priority {by}, which needs {preemptor.submit.needs}"
        victim.evicting = True
        grace = victim.submit.grace
        victim.client.send(
            protocol.Preempt(victim.submit.group, preemptor.submit.group, message, grace)
        )
        victim.reclaim = asyncio.get_running_loop().call_later(grace, self._reclaim, victim)

    def _reclaim(self, group: _Group) -> None:
        if self._groups.get(group.submit.group) is group and group.evicting:
            log.info("group %s did not stop within its grace: GPUs reclaimed", group.submit.group)
            group.reclaim = None
            self._requeue(group)
            self._schedule()

    def listing(self) -> protocol.Listing:
        """Every group on the machine, admitted ones first, then the queue in order."""
        entries = []
        waiting = {g.request.name: g for g in self._groups.values() if g.admitted is None}
        places = {
            r.name: i + 1
            for i, r in enumerate(admission.order(g.request for g in waiting.values()))
        }
        for name, group in self._groups.items():
            state = "evicting" if group.evicting else "admitted" if group.admitted else "queued"
            entries.append(
                protocol.Entry(
                    group=name,
                    kernel_id=group.submit.kernel_id,
                    queue=group.request.queue,
                    priority=group.request.priority,
                    state=state,
                    devices=group.devices,
                    position=places.get(name, 0),
                    uid=group.client.uid,
                    pid=group.client.pid,
                )
            )
        entries.sort(key=lambda e: (e.position, e.group))
        return protocol.Listing(tuple(entries))


def _short(kernel_id: str) -> str:
    return kernel_id.replace("-", "")[:8].lower()  # as model.short_id
