"""The machine queue's wire format: newline-delimited JSON messages carrying a protocol version.

Pure: dataclasses, their encoding and decoding, and the sentences both sides show. A client
says `hello` first; the service answers `welcome` (its version, pid and protocol, a shape that
never changes, so any client can read it) and then `refused` if the protocol differs or the
quota differs from the one in force (a system service, whose quota is its config's, refuses
no quota). Groups are named by the client (the local backend's group name) and unique on the
machine. Fields added since protocol 1 have defaults and a peer ignores fields it does not know,
so those additions need no new protocol.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from kernel_queue import admission

PROTOCOL = 2
"""Bump on any change a peer of the other version could misread (2: places in one message)."""

FLAVOR = "local"


class ProtocolError(ValueError):
    """A line that is not one of this protocol's messages."""


@dataclass(frozen=True)
class Quota:
    """What the machine offers, as one client's settings say: GPU ids, CPU in millicores,
    memory in bytes, the queue names, priority classes, strategy and preemption policy."""

    gpus: tuple[str, ...]
    cpu: int
    memory: int
    queues: tuple[str, ...]
    priority_classes: Mapping[str, int]
    strategy: str = "BestEffortFIFO"
    preemption: str = "LowerPriority"
    pretend: bool = False

    def cluster_queue(self) -> admission.ClusterQueue:
        """The one ClusterQueue all queues share (also `backends/local/quota.py`'s, in a server)."""
        quota = {"gpu": len(self.gpus), "cpu": self.cpu, "memory": self.memory}
        return admission.ClusterQueue(
            name=FLAVOR,
            resource_groups=(
                admission.ResourceGroup(frozenset(quota), (admission.Flavor(FLAVOR, quota),)),
            ),
            strategy=admission.QueueingStrategy(self.strategy),
            preemption=admission.PreemptionPolicy(self.preemption),
        )

    def differences(self, other: Quota) -> list[str]:
        """Each setting where `other` differs, as "gpus ['0'] here, ['0', '1'] in force"."""
        mine, theirs = _plain(asdict(self)), _plain(asdict(other))
        return [
            f"{name} {mine[name]!r} here, {theirs[name]!r} in force"
            for name in mine
            if mine[name] != theirs[name]
        ]

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Quota:
        return cls(
            gpus=tuple(str(d) for d in data["gpus"]),
            cpu=int(data["cpu"]),
            memory=int(data["memory"]),
            queues=tuple(str(q) for q in data["queues"]),
            priority_classes={str(k): int(v) for k, v in data["priority_classes"].items()},
            strategy=str(data["strategy"]),
            preemption=str(data["preemption"]),
            pretend=bool(data.get("pretend", False)),
        )


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""


# -- client to service -----------------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    TYPE: ClassVar[str] = "hello"
    protocol: int
    version: str
    pid: int
    quota: (
        Quota | None
    )  # None from a watcher, or a peer of another protocol whose quota did not parse
    watch: bool = False  # list only: no quota, no groups (`jupyter kernel-queue status --machine`)


@dataclass(frozen=True)
class Submit(Message):
    """Queue group `group`; `needs` and `priority_class` are for the preemption sentence."""

    TYPE: ClassVar[str] = "submit"
    group: str
    kernel_id: str
    queue: str
    priority: int
    resources: Mapping[str, int]
    grace: float
    priority_class: str | None = None
    needs: str = ""
    holds: tuple[str, ...] | None = None
    """Set when the group already runs on these GPUs (none: `()`) and its client says so again
    to a service that restarted: the service takes the lease back instead of queueing it."""


@dataclass(frozen=True)
class Release(Message):
    TYPE: ClassVar[str] = "release"
    group: str


@dataclass(frozen=True)
class Requeue(Message):
    """After a preempted (or parked) kernel stopped: back of its queue, GPUs given back."""

    TYPE: ClassVar[str] = "requeue"
    group: str


@dataclass(frozen=True)
class List(Message):
    TYPE: ClassVar[str] = "list"


# -- service to client -----------------------------------------------------------------------


@dataclass(frozen=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    version: str
    pid: int
    protocol: int
    quota: Quota | None = None  # None before any client said hello, or from another protocol
    system: bool = False  # the machine's system service: its quota is its config's, for everyone


@dataclass(frozen=True)
class Position(Message):
    """1-based place in the group's queue, as the local backend's QueuePlace; `reason` says why
    it waits when the machine's rules hold it back (its user's GPU limit), else it is empty."""

    TYPE: ClassVar[str] = "position"
    group: str
    queue: str
    position: int
    length: int
    reason: str = ""


@dataclass(frozen=True)
class Places(Message):
    """Every changed place of one client's groups after an admission pass, in one line: a
    release moves every waiting group up one, and 200 lines cost more than the pass itself.
    On the wire each place is [group, queue, position, length, reason]."""

    TYPE: ClassVar[str] = "places"
    places: tuple[Position, ...] = ()


@dataclass(frozen=True)
class Admit(Message):
    TYPE: ClassVar[str] = "admit"
    group: str
    devices: tuple[str, ...]
    flavor: str = FLAVOR


@dataclass(frozen=True)
class Preempt(Message):
    """Stop `group` (the victim) within `grace` seconds; its GPUs are reclaimed then anyway."""

    TYPE: ClassVar[str] = "preempt"
    group: str
    by: str
    message: str
    grace: float


@dataclass(frozen=True)
class Refused(Message):
    """A request (of `group`, or the connection's when empty) the service will not carry out."""

    TYPE: ClassVar[str] = "refused"
    message: str
    group: str = ""


@dataclass(frozen=True)
class Entry:
    """One group in a listing; `uid`, `user` and `pid` are its client's (SO_PEERCRED), `gpus`
    how many it asks for. Another user's group comes without `group`, `kernel_id` and `pid`."""

    group: str
    kernel_id: str
    queue: str
    priority: int
    state: str  # "queued", "admitted" or "evicting"
    devices: tuple[str, ...] = ()
    position: int = 0
    uid: int = -1
    pid: int = 0
    user: str = ""
    gpus: int = 0


@dataclass(frozen=True)
class Listing(Message):
    """The groups the asker may see; `hidden` counts the others' by state (a system service
    whose privacy is "counts"); `gpus` the machine's, `gpus_in_use` those admitted groups hold."""

    TYPE: ClassVar[str] = "listing"
    groups: tuple[Entry, ...] = field(default=())
    hidden: Mapping[str, int] = field(default_factory=dict)
    gpus: int = 0
    gpus_in_use: int = 0


MESSAGES: dict[str, type[Message]] = {
    kind.TYPE: kind
    for kind in (
        *(Hello, Submit, Release, Requeue, List),
        *(Welcome, Position, Places, Admit, Preempt, Refused, Listing),
    )
}


def encode(message: Message) -> bytes:
    """One line: the message's fields and its `type`, keys sorted."""
    if isinstance(message, Places):
        rows = [[p.group, p.queue, p.position, p.length, p.reason] for p in message.places]
        return json.dumps({"places": rows, "type": Places.TYPE}).encode() + b"\n"
    # Keys are put in sorted order here, so json.dumps needs no arguments and uses its shared
    # encoder (sort_keys=True builds a new one per call: most of a message's cost).
    return json.dumps(_fields(message)).encode() + b"\n"


_ORDER: dict[type, tuple[str, ...]] = {}
_PLAN: dict[type, tuple[tuple[str, bool], ...]] = {}
_COMPOSITE = ("tuple", "Quota", "Mapping", "Entry")


def _names(kind: type) -> tuple[str, ...]:
    """The fields of `kind` (and `type` for a message), sorted."""
    names = _ORDER.get(kind)
    if names is None:
        own = [f.name for f in fields(kind)]
        names = _ORDER[kind] = tuple(sorted([*own, "type"] if issubclass(kind, Message) else own))
    return names


def _plan(kind: type) -> tuple[tuple[str, bool], ...]:
    """`_names(kind)`, each with whether its value needs converting (a tuple, mapping or
    dataclass) rather than going to JSON as it is: a position message has none."""
    plan = _PLAN.get(kind)
    if plan is None:
        types = {f.name: str(f.type) for f in fields(kind)}
        plan = _PLAN[kind] = tuple(
            (name, any(word in types.get(name, "") for word in _COMPOSITE)) for name in _names(kind)
        )
    return plan


def _fields(value: Any) -> Any:
    # asdict's deep copies cost 20 us a message: a pass tells every waiting group its place.
    if isinstance(value, (Message, Quota, Entry)):
        body = {}
        for name, composite in _plan(type(value)):
            if name == "type" and isinstance(value, Message):
                body[name] = value.TYPE
            else:
                item = getattr(value, name)
                body[name] = _fields(item) if composite else item
        return body
    if isinstance(value, tuple):
        return [_fields(item) for item in value]
    if isinstance(value, Mapping):
        return {key: value[key] for key in sorted(value)}
    return value


def decode(line: bytes) -> Message:
    """The message on `line`; ProtocolError naming what is wrong."""
    try:
        data = json.loads(line)
        kind = MESSAGES[data.pop("type")]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"not a kernel-queue message: {line[:200]!r}") from exc
    try:
        values = {name: data[name] for name in _names(kind) if name in data and name != "type"}
        if values.get("quota") is not None:
            values["quota"] = _quota(kind, values)
        if "devices" in values:
            values["devices"] = tuple(values["devices"])
        if values.get("holds") is not None:
            values["holds"] = tuple(str(d) for d in values["holds"])
        if kind is Places:
            values["places"] = tuple(Position(*row) for row in values.get("places", ()))
        if kind is Listing:
            values["groups"] = tuple(
                Entry(**{**g, "devices": tuple(g.get("devices", ()))})
                for g in values.get("groups", ())
            )
        return kind(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed {kind.TYPE!r} message: {line[:200]!r} ({exc})") from exc


def _quota(kind: type[Message], values: dict[str, Any]) -> Quota | None:
    if values.get("quota") is None and values.get("protocol") != PROTOCOL:
        return None
    try:
        return Quota.parse(values["quota"])
    except (KeyError, TypeError, ValueError, AttributeError):
        if kind in (Hello, Welcome) and values.get("protocol") != PROTOCOL:
            return None  # read only to tell which peer runs
        raise


def mismatch(service: Welcome, version: str, protocol: int = PROTOCOL) -> str:
    """The sentence a client of another protocol gets, naming the running service."""
    return (
        f"the machine's kernel-queue service (pid {service.pid}, version {service.version}, "
        f"protocol {service.protocol}) speaks another protocol than this server (version "
        f"{version}, protocol {protocol}); stop it with `kill {service.pid}` (its kernels keep "
        "running until their servers stop them) or restart this server with version "
        f"{service.version}"
    )


def quota_differs(differences: list[str], pid: int) -> str:
    """The sentence a client whose settings differ from the quota in force gets."""
    return (
        "this server's local-backend quota differs from the one the machine's kernel-queue "
        f"service (pid {pid}) enforces for every server of this user: {'; '.join(differences)}. "
        "Give every server the same c.LocalBackend settings, or stop the other servers first."
    )
