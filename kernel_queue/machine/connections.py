"""What the machine's queue service keeps of each connection and of each group it queues.

A `Client` is one connection: who is at the other end (SO_PEERCRED), the rule that applies to
them, its groups, and the messages one loop turn has for it (sent in one write). A `Group` is
one submitted kernel group: its request, its admission and GPUs, and its preemption's timer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kernel_queue import admission
from kernel_queue.machine import config, protocol, rules


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
