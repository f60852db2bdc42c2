"""The machine's queue service: the process owning the local queue, one per machine and user
(or, run as the system service, one per machine for every user).

Every client (a local backend in any Jupyter server, nbconvert or papermill process) connects
to one Unix socket, says `hello` with the quota it would use and submits its groups; the
service runs `admission.schedule` over all of them on every change and tells each client its
groups' positions, admissions and preemptions. It keeps a `Client` for each connection (who is
at the other end, by SO_PEERCRED, the rule that applies to them, their groups, and the messages
one loop turn has for them, sent in one write) and a `Group` for each submitted kernel group
(its request, admission and GPUs, and its preemption's timer). An admitted group is a lease held by
its client's connection: when the connection ends (EOF, a SIGKILLed client) its groups are gone at
once. A preempted group's GPUs come back after its grace seconds whether or not its client answered.

A restart of the service is not an outage: it keeps a record of the leases beside its socket
(`<socket>.leases.json`), and a service that starts takes the record's leases of clients still
alive as held, for `RECLAIM_SECONDS`, so nobody else is given their GPUs while their clients
reconnect and say which groups they still run (a `submit` with `holds`); a lease nobody claims
in that time is freed. A user's service exits
`IDLE_EXIT_SECONDS` after the last client left; the system service (`system` given: one socket
for every user, its quota and per-user rules from its config, `rules.py`) never does. Stdlib
and, of ours, `admission`, `quantities` and `errors` only: it must stay small.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernel_queue import admission
from kernel_queue.machine import config, protocol, rules, sockets

IDLE_EXIT_SECONDS = 3.0
"""How long the service outlives its last client (a server restarting finds it still there)."""
RECLAIM_SECONDS = 30.0
"""How long a lease from before a restart stays held for its client to claim it back."""

log = logging.getLogger("kernel_queue.machine")


AlreadyRunning = sockets.AlreadyRunning


class _Absent:
    """The writer of a client that has not come back (see `Client.absent`): writes nothing."""

    def is_closing(self) -> bool:
        return True

    def write(self, data: bytes) -> None:  # never called: `send` checks is_closing first
        pass


@dataclass(eq=False)
class Client:
    writer: asyncio.StreamWriter
    pid: int  # the peer's, from SO_PEERCRED, as `who`
    who: config.Identity
    rule: config.Rule = field(default_factory=config.Rule)
    greeted: bool = False
    watch: bool = False  # a listing-only connection: no quota, no groups
    groups: set[str] = field(default_factory=set)
    pending: list[bytes] = field(default_factory=list)

    @classmethod
    def absent(cls, pid: int, who: config.Identity) -> Client:
        """The client that held leases before the service restarted, until it comes back (or
        its leases' grace ends): messages to it go nowhere."""
        return cls(_Absent(), pid, who, greeted=True)  # type: ignore[arg-type]

    @property
    def present(self) -> bool:
        return not isinstance(self.writer, _Absent)

    def send(self, message: protocol.Message) -> None:
        """Queue `message`; what one loop turn sends goes out in one write (a pass tells
        every waiting group its place: one system call per message was most of its cost)."""
        if self.writer.is_closing():
            return
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append(protocol.encode(message))

    def flush(self) -> None:
        data, self.pending = b"".join(self.pending), []
        if data and not self.writer.is_closing():
            self.writer.write(data)


@dataclass(eq=False)
class Group:
    submit: protocol.Submit
    client: Client
    request: admission.Request
    admitted: admission.Admitted | None = None
    devices: tuple[str, ...] = ()
    evicting: bool = False
    reclaim: asyncio.TimerHandle | None = None
    shown: protocol.Position | None = None  # the last place told, so only changes are sent
    expires: asyncio.TimerHandle | None = None  # a lease from before a restart, unclaimed yet

    def holding(self) -> rules.Holding:
        gpus = self.request.resources.get("gpu", 0)
        return rules.Holding(
            self.request.name, self.client.who.uid, gpus, self.client.rule.max_gpus
        )


class Service:
    """The queue of one machine and user, served on `path` until idle; or, given `system`, the
    queue of every user of the machine, served until SIGTERM."""

    def __init__(
        self,
        path: Path,
        version: str,
        idle_exit: float = IDLE_EXIT_SECONDS,
        system: config.SystemConfig | None = None,
    ) -> None:
        self.path = path
        self.version = version
        self.idle_exit = idle_exit
        self.system = system
        self.quota: protocol.Quota | None = None if system is None else system.quota
        self._clients: set[Client] = set()
        self._groups: dict[str, Group] = {}
        self._arrivals = itertools.count()
        self._done = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None
        self._pass: asyncio.Handle | None = None
        self.record = path.with_name(path.name + ".leases.json")
        self._recorded: object = None  # what the record last said
        self._exiting = False

    async def serve(self) -> None:
        """Bind, serve clients, return once no client came for `idle_exit` seconds or on
        SIGTERM; the socket file is removed if it is still this service's."""
        listener = sockets.bind(self.path, shared=self.system is not None)
        inode = os.stat(self.path).st_ino
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._done.set)
        self._load_record()
        server = await asyncio.start_unix_server(self._connection, sock=listener)
        log.info("kernel-queue service %s (pid %d) on %s", self.version, os.getpid(), self.path)
        self._arm_idle()
        try:
            await self._done.wait()
        finally:
            self._exiting = True  # the record keeps the leases for the next service
            server.close()
            for client in list(self._clients):
                client.flush()
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
        if not self._clients and self.system is None and not self._groups:
            self._idle = asyncio.get_running_loop().call_later(self.idle_exit, self._done.set)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, gid = sockets.peer(writer.get_extra_info("socket"))
        who = await asyncio.to_thread(config.identify, uid, gid)  # NSS may ask a directory
        client = Client(writer, pid, who)
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
            client.flush()  # a refusal queued before the hang-up still goes out
            writer.close()

    def _handle(self, client: Client, message: protocol.Message) -> bool:
        """Carry out one message; False ends the connection."""
        if isinstance(message, protocol.Hello):
            return self._greet(client, message)
        if not client.greeted:
            client.send(protocol.Refused(f"say hello first (protocol {protocol.PROTOCOL})"))
            return False
        if isinstance(message, protocol.Submit):
            self._submit(client, message)
        elif isinstance(message, protocol.Release):
            group = self._own(client, message.group, "release")
            if group is not None:
                self._remove(group)
                self._schedule()
        elif isinstance(message, protocol.Requeue):
            group = self._own(client, message.group, "requeue")
            if group is not None and group.admitted is not None:
                self._requeue(group)
                self._schedule()
        elif isinstance(message, protocol.List):
            if self._pass is not None:  # what came before the list is decided in it
                self._pass.cancel()
                self._run_pass()
            client.send(self.listing(client.who.uid))
        else:
            client.send(protocol.Refused(f"a client does not send {message.TYPE!r}"))
        return True

    def _greet(self, client: Client, hello: protocol.Hello) -> bool:
        known = hello.protocol == protocol.PROTOCOL and (hello.quota is not None or hello.watch)
        client.watch = hello.watch
        if self.system is not None:
            client.rule = self.system.rule_for(client.who)
        elif (
            known and not client.watch and not any(c.greeted and not c.watch for c in self._clients)
        ):
            self.quota = hello.quota  # the first client's settings hold while any client does
        pid = os.getpid()
        client.send(
            protocol.Welcome(self.version, pid, protocol.PROTOCOL, self.quota, bool(self.system))
        )
        if not known:
            welcome = protocol.Welcome(self.version, pid, protocol.PROTOCOL)
            refusal = protocol.mismatch(welcome, hello.version, hello.protocol)
        elif self.system is None and hello.quota is not None and self.quota is not None:
            differences = hello.quota.differences(self.quota)
            refusal = protocol.quota_differs(differences, pid) if differences else ""
        else:
            refusal = ""
        if refusal:
            client.send(protocol.Refused(refusal))
            return False
        client.greeted = True
        log.info(
            "client pid %d (%s, uid %d, version %s%s) joined",
            *(client.pid, client.who.user, client.who.uid, hello.version),
            ", watching" if client.watch else "",
        )
        return True

    def _own(self, client: Client, name: str, verb: str) -> Group | None:
        """The client's group `name`; None (and, if it is another's, a Refused) otherwise."""
        group = self._groups.get(name)
        if group is None or group.client is client:
            return group
        holder = group.client
        same = holder.who.uid == client.who.uid
        client.send(
            protocol.Refused(rules.not_yours(name, verb, holder.who.user, holder.pid, same), name)
        )
        return None

    def _submit(self, client: Client, submit: protocol.Submit) -> None:
        existing = self._groups.get(submit.group)
        if existing is not None and existing.client is client:
            return  # said twice
        if submit.holds is not None and self._reclaim_lease(client, submit, existing):
            return
        checked = self._checked(client, submit)
        if isinstance(checked, str):
            client.send(protocol.Refused(checked, submit.group))
            return
        submit = checked
        assert self.quota is not None
        request = self._request(submit)
        unfit = admission.check_fits_ever(self.quota.cluster_queue(), request)
        if unfit is not None:
            client.send(protocol.Refused(unfit.message, submit.group))
            return
        self._groups[submit.group] = Group(submit, client, request)
        client.groups.add(submit.group)
        self._schedule()

    def _reclaim_lease(
        self,
        client: Client,
        submit: protocol.Submit,
        existing: Group | None,
    ) -> bool:
        """A client back after this service restarted says group `submit.group` runs on
        `submit.holds`: take the lease back from the record's (same user), or give it as a
        new lease where those GPUs are free; where they went to another group meanwhile, the
        group is preempted (it saves and waits). False: nothing to reclaim (queue it)."""
        assert submit.holds is not None
        if existing is not None and not existing.client.present:
            if existing.client.who.uid != client.who.uid:
                return False  # another user's lease: the submit is refused as usual
            self._adopt(existing, client, submit)
            client.send(protocol.Admit(submit.group, existing.devices))
            log.info("group %s taken back by client pid %d", submit.group, client.pid)
            self._schedule()
            return True
        checked = self._checked(client, submit)
        if isinstance(checked, str) or self.quota is None:
            return False
        busy = {d for g in self._groups.values() if g.admitted for d in g.devices}
        held = tuple(submit.holds)
        request = self._request(checked)
        group = Group(checked, client, request)
        self._groups[submit.group] = group
        client.groups.add(submit.group)
        _hold(group, asyncio.get_running_loop().time())
        # (a holds with no lease on record jumps no queue: free GPUs with nobody waiting only)
        waiting = any(g.admitted is None for g in self._groups.values() if g is not group)
        if busy.isdisjoint(held) and set(held) <= set(self.quota.gpus) and not waiting:
            group.devices = held
            client.send(protocol.Admit(submit.group, held))
        else:  # its GPUs went to another group: it saves and waits like a preempted one
            group.evicting = True
            message = (
                "preempted: the machine's kernel-queue service restarted and gave its GPUs to "
                "another kernel before it came back"
            )
            client.send(protocol.Preempt(submit.group, "", message, submit.grace))
            group.reclaim = asyncio.get_running_loop().call_later(
                submit.grace, self._reclaim, group
            )
        self._schedule()
        return True

    def _request(self, submit: protocol.Submit) -> admission.Request:
        """The admission engine's request for `submit`, in arrival order."""
        return admission.Request(
            name=submit.group,
            queue=submit.queue,
            resources=dict(submit.resources),
            priority=submit.priority,
            created=float(next(self._arrivals)),
        )

    def _adopt(self, group: Group, client: Client, submit: protocol.Submit) -> None:
        """A lease from the record, claimed back by its (new) connection."""
        if group.expires is not None:
            group.expires.cancel()
        group.expires = None
        group.client.groups.discard(group.submit.group)
        group.client, group.submit = client, submit
        client.groups.add(submit.group)

    def _load_record(self) -> None:
        """Take the leases the record names for clients still alive, held for
        `RECLAIM_SECONDS` (a system service: of the users the record names)."""
        try:
            data = json.loads(self.record.read_text())
            leases = list(data["leases"])
            quota = protocol.Quota.parse(data["quota"]) if data.get("quota") else None
        except (OSError, ValueError, KeyError, TypeError):
            return
        if self.quota is None:
            self.quota = quota
        loop = asyncio.get_running_loop()
        for lease in leases:
            try:
                submit = protocol.decode(json.dumps({**lease["submit"], "type": "submit"}).encode())
                pid, uid, user = int(lease["pid"]), int(lease["uid"]), str(lease["user"])
                devices = tuple(str(d) for d in lease["devices"])
            except (protocol.ProtocolError, KeyError, TypeError, ValueError):
                continue
            if not isinstance(submit, protocol.Submit) or not _alive(pid):
                continue
            client = Client.absent(pid, config.Identity(uid, uid, user))
            request = self._request(submit)
            group = Group(submit, client, request, devices=devices)
            _hold(group, loop.time())
            group.expires = loop.call_later(RECLAIM_SECONDS, self._expire, group)
            self._groups[submit.group] = group
            client.groups.add(submit.group)
            log.info(
                "lease of %s (client pid %d) from before the restart held for %g s",
                submit.group,
                pid,
                RECLAIM_SECONDS,
            )

    def _expire(self, group: Group) -> None:
        if self._groups.get(group.submit.group) is group and not group.client.present:
            log.info("lease of %s not claimed back: freed", group.submit.group)
            self._remove(group)
            self._schedule()
            self._arm_idle()

    def _save_record(self) -> None:
        """Write the leases (atomically, private) when they changed since the last write;
        not while exiting (its clients' connections end then, and their leases go on)."""
        if self._exiting:
            return
        leases = [
            {
                "submit": {k: v for k, v in protocol._fields(g.submit).items() if k != "type"},
                "pid": g.client.pid,
                "uid": g.client.who.uid,
                "user": g.client.who.user,
                "devices": list(g.devices),
            }
            for g in self._groups.values()
            if g.admitted is not None
        ]
        quota = None if self.quota is None else protocol._fields(self.quota)
        record = {"leases": leases, "quota": quota}
        if record == self._recorded:
            return
        self._recorded = record
        temporary = self.record.with_name(self.record.name + ".tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
            os.replace(temporary, self.record)
        except OSError as exc:
            log.warning("could not write the lease record %s: %s", self.record, exc)

    def _checked(self, client: Client, submit: protocol.Submit) -> protocol.Submit | str:
        """`submit` as this machine takes it (a system service sets its priority), or the
        sentence refusing it."""
        existing = self._groups.get(submit.group)
        if client.watch or self.quota is None:
            return rules.WATCHING
        if existing is not None:
            same = existing.client.who.uid == client.who.uid
            return rules.already_queued(submit.group, existing.client.pid, same)
        if submit.queue not in self.quota.queues:
            known = ", ".join(self.quota.queues)
            return f"queue {submit.queue!r} does not exist on this machine; known queues: {known}"
        if self.system is not None:
            return rules.check_submit(self.system, client.who, submit)
        return submit

    def _remove(self, group: Group) -> None:
        if group.reclaim is not None:
            group.reclaim.cancel()
        if group.expires is not None:
            group.expires.cancel()
        self._groups.pop(group.submit.group, None)
        group.client.groups.discard(group.submit.group)

    def _requeue(self, group: Group) -> None:
        """Give back the group's GPUs and put it at the back of its queue."""
        if group.reclaim is not None:
            group.reclaim.cancel()
        group.reclaim = None
        group.admitted, group.devices, group.evicting, group.shown = None, (), False, None
        group.request = replace(group.request, created=float(next(self._arrivals)))

    def _drop(self, client: Client) -> None:
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
        """Run the admission engine over every client's groups and tell each client; keep the
        record of leases."""
        self._pass = None
        try:
            self._admission_pass()
        finally:
            self._save_record()

    def _admission_pass(self) -> None:
        if self.quota is None or not self._groups:
            return
        groups, cq = self._groups, self.quota.cluster_queue()
        held = self._held()
        admitted = [replace(g.admitted, evicting=g.evicting) for g in groups.values() if g.admitted]
        # A group whose user is at their max_gpus waits outside the engine; so does one the pass
        # would admit past it (two of the user's admitted at once), and the pass runs again.
        queued = [name for name, g in groups.items() if not g.admitted]
        limited = rules.past_limits(self._limits(queued), held, each=True)
        while True:
            pending = [groups[name].request for name in queued if name not in limited]
            decision = admission.schedule(cq, pending, admitted)
            past = rules.past_limits(self._limits(g.name for g in decision.admit), held)
            if not past:  # at most one more pass per group held back
                break
            limited |= past
        for preemption in decision.preempt:
            self._evict(groups[preemption.victim], groups[preemption.preemptor])
        for grant in decision.admit:
            self._admit(groups[grant.name], grant)
        if limited:  # places among every waiting group, those held back too
            held = self._held()
            places = rules.places([g.request for g in groups.values() if not g.admitted])
        else:
            places = {n: (p.in_queue + 1, p.queue_length) for n, p in decision.positions.items()}
        told: dict[Client, list[protocol.Position]] = {}
        for name, (in_queue, length) in places.items():
            group = groups[name]
            reason = ""
            if name in limited:
                limit = group.client.rule.max_gpus or 0
                reason = rules.limit_reason(group.client.who, held[group.client.who.uid], limit)
            place = protocol.Position(name, group.request.queue, in_queue, length, reason)
            if place != group.shown:
                group.shown = place
                told.setdefault(group.client, []).append(place)
        for client, changed in told.items():
            client.send(protocol.Places(tuple(changed)))

    def _held(self) -> Counter[int]:
        """GPUs held by each uid's admitted (or evicting) groups; none counted without limits."""
        held: Counter[int] = Counter()
        for group in self._groups.values() if self.system is not None else ():
            if group.admitted is not None:
                held[group.client.who.uid] += group.request.resources.get("gpu", 0)
        return held

    def _limits(self, names: Iterable[str]) -> list[rules.Holding]:
        """The groups `names` as max_gpus sees them; none without a config (no limits)."""
        return [] if self.system is None else [self._groups[n].holding() for n in names]

    def _admit(self, group: Group, grant: admission.Admission) -> None:
        assert self.quota is not None
        busy = {d for g in self._groups.values() if g.admitted for d in g.devices}
        free = [d for d in self.quota.gpus if d not in busy]
        group.devices = tuple(free[: group.request.resources.get("gpu", 0)])
        group.admitted = admission.Admitted(
            group.request, grant.flavors, asyncio.get_running_loop().time()
        )
        group.shown = None
        group.client.send(protocol.Admit(group.submit.group, group.devices))

    def _evict(self, victim: Group, preemptor: Group) -> None:
        """Ask the holder to stop; reclaim its GPUs after its grace whatever it does."""
        message = rules.preempted_by(preemptor.submit)
        victim.evicting = True
        grace = victim.submit.grace
        victim.client.send(
            protocol.Preempt(victim.submit.group, preemptor.submit.group, message, grace)
        )
        victim.reclaim = asyncio.get_running_loop().call_later(grace, self._reclaim, victim)

    def _reclaim(self, group: Group) -> None:
        if self._groups.get(group.submit.group) is group and group.evicting:
            log.info("group %s did not stop within its grace: GPUs reclaimed", group.submit.group)
            group.reclaim = None
            self._requeue(group)
            self._schedule()

    def listing(self, uid: int) -> protocol.Listing:
        """Every group on the machine as the user `uid` may see it (`rules.for_viewer`),
        admitted ones first, then the queue in order, and the GPUs in use."""
        entries = []
        places = rules.places([g.request for g in self._groups.values() if not g.admitted])
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
                    position=places.get(name, (0, 0))[0],
                    uid=group.client.who.uid,
                    pid=group.client.pid,
                    user=group.client.who.user,
                    gpus=group.request.resources.get("gpu", 0),
                )
            )
        entries.sort(key=lambda e: (e.position, e.group))
        privacy = "names" if self.system is None else self.system.privacy
        shown, hidden = rules.for_viewer(entries, uid, privacy)
        gpus = 0 if self.quota is None else len(self.quota.gpus)
        in_use = sum(len(g.devices) for g in self._groups.values() if g.admitted is not None)
        return protocol.Listing(shown, hidden, gpus, in_use)


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _hold(group: Group, now: float) -> None:
    """Mark `group` admitted as it already is (a lease from before a restart)."""
    flavors = {resource: protocol.FLAVOR for resource in group.request.resources}
    group.admitted = admission.Admitted(group.request, flavors, now)
