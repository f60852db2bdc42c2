"""Why a waiting kernel's Workload waits, from Kueue's conditions, in a notebook user's words.

`explain` reads the Workload's `QuotaReserved=False` condition, `spec.active` and the
LocalQueue's `Active` condition and says what the kernel waits for: quota (how much of what is
missing, parsed from the flavor assigner's message), other workloads' pods to be ready, a
misconfigured, stopped or inactive queue, or Kueue itself when it has not answered. Two shapes
of the condition are read: the granular reasons (`WaitingForQuota`, `ExceedsMaxQuota`,
`WaitingForPodsReady`, `Misconfigured`, `Suspended`, …; Kueue 0.20's default, #13063) and the
older `Pending`, `Inadmissible` and `Waiting` with the same messages (0.14 to 0.19). A request
larger than the ClusterQueue could ever give (`ExceedsMaxQuota`, or only "> maximum capacity"
and "unavailable in ClusterQueue" in the message) is `Reason.never`, the sentence the kernel
fails with. The messages are Kueue's (`pkg/scheduler/flavorassigner/flavorassigner.go`,
`pkg/controller/core/workload_controller.go`, `pkg/scheduler/scheduler.go`). Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

Obj = Mapping[str, Any]

QUOTA_RESERVED = "QuotaReserved"
ACTIVE = "Active"
# QuotaReserved=False reasons: granular (0.20 default) and older (0.14-0.19).
WAITING_FOR_QUOTA, EXCEEDS_MAX_QUOTA = "WaitingForQuota", "ExceedsMaxQuota"
NO_MATCHING_FLAVOR, WAITING_FOR_PREEMPTED = "NoMatchingFlavor", "WaitingForPreemptedWorkloads"
WAITING_FOR_PODS_READY, WAITING = "WaitingForPodsReady", "Waiting"
MISCONFIGURED, SUSPENDED, INADMISSIBLE = "Misconfigured", "Suspended", "Inadmissible"
ADMISSION_GATED, TOPOLOGY_FAILED = "AdmissionGated", "TopologyPlacementFailed"
# LocalQueue Active=False reasons.
CQ_DOES_NOT_EXIST, CQ_IS_INACTIVE, STOPPED = (
    "ClusterQueueDoesNotExist",
    "ClusterQueueIsInactive",
    "Stopped",
)

_NAME = r"[^\s,;]+"
_SHORT = re.compile(
    rf"insufficient unused quota (?:in cohort )?for (?P<resource>{_NAME}) in flavor "
    rf"(?P<flavor>{_NAME}), (?P<amount>{_NAME}) more needed"
)
_MAXIMUM = re.compile(  # since 0.14.8; before: "request > maximum capacity (3 > 2)"
    rf"insufficient quota for (?P<resource>{_NAME}) in flavor (?P<flavor>{_NAME}), "
    r"(?:previously considered podsets requests \((?P<before>[^)]*)\) \+ current podset "
    r"request \((?P<request>[^)]*)\) > maximum capacity \((?P<most>[^)]*)\)"
    r"|request > maximum capacity \((?P<old_request>\S+) > (?P<old_most>[^)]+)\))"
)
_UNAVAILABLE = re.compile(rf"resource (?P<resource>{_NAME}) unavailable in ClusterQueue")
_PREEMPTING = re.compile(r"Pending the preemption of (?P<count>\d+) workload\(s\)")
_FLAVORS = "couldn't assign flavors to pod set"
_PODS_READY = "waiting for all admitted workloads to be in PodsReady condition"
_BLOCKER = re.compile(  # Kueue's workload controller and scheduler on a queue that keeps it out
    rf"^(?P<kind>LocalQueue|ClusterQueue) (?P<name>{_NAME}) (?P<what>doesn't exist|is "
    r"terminating or missing|not found|is stopped|is inactive)"
)
ADMIN = "the cluster's admin"


@dataclass(frozen=True)
class Queue:
    """What the backend knows of the kernel's LocalQueue (`kube.queueing.local_queues` reads it)."""

    name: str
    cluster_queue: str = ""  # "" until the LocalQueue was read
    active: tuple[str, str, str] | None = None  # its Active condition: (status, reason, message)

    @property
    def where(self) -> str:
        """ "ClusterQueue 'gpu-cq'", or "the ClusterQueue of LocalQueue 'user-queue'"."""
        if self.cluster_queue:
            return f"ClusterQueue {self.cluster_queue!r}"
        return f"the ClusterQueue of LocalQueue {self.name!r}"


@dataclass(frozen=True)
class Reason:
    """Why the kernel waits. `why`: the clause its reason adds ("" when Kueue says nothing more
    than that it waits). `answered`: False while Kueue has not answered at all. `never`: not ""
    when the request can never be admitted, the sentence to fail with (after "kernel 1a2b3c4d"),
    and `has` what the queue could ever give of the resource that does not fit, by kernelspec
    key ({"gpus": 2}, {"cpu": "16"}; None where that resource is no key of the kernelspec's).
    `estimable`: it waits its turn for quota, so the queue's admission rate says how long."""

    why: str = ""
    answered: bool = True
    never: str = ""
    estimable: bool = False
    has: dict[str, int | str] | None = None


@dataclass(frozen=True)
class _Parsed:
    """The flavor assigner's message taken apart."""

    short: tuple[tuple[str, str, str], ...]  # (resource, flavor, amount missing)
    maximum: tuple[tuple[str, str, str, str], ...]  # (resource, flavor, request, capacity)
    unavailable: tuple[str, ...]  # resources no resource group covers
    preempting: int  # workloads being preempted to make room
    other: bool  # reasons neither kind (a flavor's taints or labels, topology, …)


def explain(
    workload: Obj | None,
    *,
    queue: Queue,
    positioned: bool = False,
    waited: float = 0.0,
    within: float = 0.0,
    keys: Mapping[str, str] | None = None,
) -> Reason:
    """Why the kernel waits. `positioned`: the visibility API (or the LocalQueue's count) placed
    it, so Kueue answers. `waited`: seconds since its pods were made; past `within` (> 0) a
    Kueue that made no Workload, or left it without condition or place, "does not answer".
    `keys`: resource name -> the kernelspec key that asks for it ("nvidia.com/gpu": "gpus")."""
    if workload is None:
        if 0 < within <= waited:
            return Reason(
                f"no Workload for the kernel's pods after {within:g} s: is Kueue's controller "
                "running in the cluster?",
                answered=False,
            )
        return Reason()
    spec = workload.get("spec") or {}
    if spec.get("active") is False:
        return Reason(_deactivated(workload))
    found = _condition(workload, QUOTA_RESERVED)
    if found is not None and found.get("status") == "False":
        told = _told(str(found.get("reason") or ""), str(found.get("message") or ""), queue, keys)
        if told is not None:
            return told
    inactive = _local_queue_inactive(queue)
    if inactive:
        return Reason(inactive)
    if found is None and not positioned and 0 < within <= waited:
        name = (workload.get("metadata") or {}).get("name", "")
        return Reason(
            f"Kueue has not looked at the kernel's Workload {name} after {within:g} s (no "
            "condition on it, no queue position): is Kueue's controller running in the cluster?",
            answered=False,
        )
    return Reason(estimable=True)


def _told(reason: str, message: str, queue: Queue, keys: Mapping[str, str] | None) -> Reason | None:
    """What a QuotaReserved=False condition says; None when it says nothing more (Pending or
    PendingEvaluation after an eviction, OnHold, …)."""
    if reason in (WAITING_FOR_PODS_READY, WAITING) or message.startswith(_PODS_READY):
        return Reason(
            "Kueue admits nothing until the pods of the workloads it admitted are ready "
            "(waitForPodsReady)",
            estimable=True,
        )
    blocker = _blocker(message, queue)
    if blocker:
        return Reason(blocker)
    if _FLAVORS in message:
        return _quota(reason, message, queue, keys or {})
    if reason == WAITING_FOR_PREEMPTED:
        return Reason(
            f"waiting for preempted workloads to free quota in {queue.where}", estimable=True
        )
    if reason in (MISCONFIGURED, INADMISSIBLE, NO_MATCHING_FLAVOR) and message:
        return Reason(f"Kueue cannot admit it: {message}")
    if reason == SUSPENDED and message:
        return Reason(f"Kueue holds it: {message}")
    if reason == ADMISSION_GATED:
        return Reason(f"held by an admission gate: {message}".rstrip(": "))
    if reason == TOPOLOGY_FAILED:
        return Reason(f"waiting for room in the cluster's topology: {message}", estimable=True)
    return None


def _quota(reason: str, message: str, queue: Queue, keys: Mapping[str, str]) -> Reason:
    parsed = parse(message)
    never_only = not (parsed.short or parsed.other) and bool(parsed.maximum or parsed.unavailable)
    if reason == EXCEEDS_MAX_QUOTA or never_only:
        return Reason(never=_never(parsed, message, queue, keys), has=_has(parsed, keys))
    if parsed.short:
        flavors = {flavor for _, flavor, _ in parsed.short}
        parts = [
            f"{amount} more {resource}" + (f" in flavor {flavor!r}" if len(flavors) > 1 else "")
            for resource, flavor, amount in parsed.short
        ]
        joiner = " or " if len(flavors) > 1 else " and "
        where = f" in {queue.where}" if queue.cluster_queue else ""
        why = f"waiting for {joiner.join(parts)} to free up{where}"
    else:
        why = f"waiting for quota in {queue.where}: {message}"
    if parsed.preempting:
        count = parsed.preempting
        why += f"; {count} workload{'s are' if count > 1 else ' is'} being preempted to make room"
    return Reason(why, estimable=True)


def _unfit(parsed: _Parsed, keys: Mapping[str, str]) -> tuple[str, str, str] | None:
    """The resource over the queue's maximum that a kernelspec key asks for first, what the
    kernel asks of it and the most the queue could give (Kueue's words), or None."""
    if not parsed.maximum:
        return None
    resource = sorted(parsed.maximum, key=lambda m: (m[0] not in keys, m[0]))[0][0]
    mine = [m for m in parsed.maximum if m[0] == resource]
    _, _, request, most = max(mine, key=lambda m: _number(m[3]) or Decimal(0))
    return resource, request, most


def _has(parsed: _Parsed, keys: Mapping[str, str]) -> dict[str, int | str] | None:
    """`Reason.has`: the most the queue gives of the unfit resource, under its kernelspec key
    (a whole number of GPUs as an int, as the local backend says it); 0 of one it has none of."""
    unfit = _unfit(parsed, keys)
    if unfit is not None:
        resource, _, most = unfit
        key = keys.get(resource)
        if key is None:
            return None
        return {key: int(most) if key == "gpus" and most.isdigit() else most}
    if parsed.unavailable and parsed.unavailable[0] in keys:
        return {keys[parsed.unavailable[0]]: 0}
    return None


def _never(parsed: _Parsed, message: str, queue: Queue, keys: Mapping[str, str]) -> str:
    """ "asks for 3 nvidia.com/gpu but ClusterQueue 'gpu-cq' can never give more than 2, so it
    could never start. Ask for fewer `gpus` in the kernelspec, or use a `queue` …" """
    unfit = _unfit(parsed, keys)
    if unfit is not None:
        resource, request, most = unfit
        return (
            f"asks for {request} {resource} but {queue.where} can never give more than {most}, "
            f"so it could never start. {_fewer(resource, keys)}, or use a `queue` whose "
            "ClusterQueue has more."
        )
    if parsed.unavailable:
        resource = parsed.unavailable[0]
        return (
            f"asks for {resource} but {queue.where} has no quota for {resource}, so it could "
            f"never start. Use a `queue` whose ClusterQueue covers {resource}, or ask {ADMIN} "
            "to add it."
        )
    return f"can never be admitted by {queue.where}: {message}"


GROUP_SIZE = "pod_group_size"
"""In `keys`: the group's pods, when more than one (each kernelspec key then asks per pod)."""


def _fewer(resource: str, keys: Mapping[str, str]) -> str:
    key = keys.get(resource)
    size = keys.get(GROUP_SIZE)
    group = f" per pod, or a smaller `pod_group_size` (now {size} pods)," if size else ""
    if key == "gpus":
        return f"Ask for fewer `gpus`{group} in the kernelspec"
    if key:
        return f"Lower `{key}`{group} in the kernelspec"
    return f"Lower its {resource} request (`pod_template` in the kernelspec)"


@functools.lru_cache(maxsize=256)  # thousands of kernels of one queue read the same messages
def parse(message: str) -> _Parsed:
    """The flavor assigner's reasons in `message`, by kind."""
    short = tuple((m["resource"], m["flavor"], m["amount"]) for m in _SHORT.finditer(message))
    maximum = tuple(
        (m["resource"], m["flavor"], _total(m), m["most"] or m["old_most"])
        for m in _MAXIMUM.finditer(message)
    )
    unavailable = tuple(m["resource"] for m in _UNAVAILABLE.finditer(message))
    preempting = _PREEMPTING.search(message)
    # Whatever else a pod set's reasons say (flavors skipped for taints or node labels, …).
    rest = _PREEMPTING.sub("", _UNAVAILABLE.sub("", _MAXIMUM.sub("", _SHORT.sub("", message))))
    rest = re.sub(rf"{_FLAVORS} {_NAME}:", "", rest)
    return _Parsed(
        short=short,
        maximum=maximum,
        unavailable=unavailable,
        preempting=int(preempting["count"]) if preempting else 0,
        other=bool(rest.strip(" ,;.")),
    )


def _total(match: re.Match[str]) -> str:
    """What the pod sets ask for in all: the current one's request plus the ones before."""
    if match["old_request"]:
        return match["old_request"]
    before, request = match["before"], match["request"]
    if before in ("", "0"):
        return str(request)
    first, second = _number(before), _number(request)
    if first is not None and second is not None:
        return str(first + second)
    return f"{before} + {request}"


def _number(text: str) -> Decimal | None:
    """A plain number ("3"), or None (a quantity with a unit, such as "32Gi")."""
    try:
        return Decimal(text) if text.isdigit() else None
    except InvalidOperation:
        return None


def _blocker(message: str, queue: Queue) -> str:
    """A queue that keeps the Workload out, as Kueue's workload controller or scheduler says
    (missing, stopped, inactive), named; the LocalQueue's own Active reason when it is known."""
    match = _BLOCKER.match(message)
    if match is None:
        return ""
    inactive = _local_queue_inactive(queue)
    if inactive:
        return inactive
    kind, name, what = match["kind"], match["name"], match["what"]
    if what in ("is stopped", "is inactive"):
        then = "restarts it" if what == "is stopped" else "fixes it"
        return f"{kind} {name!r} {what}: it admits nothing until {ADMIN} {then}"
    if kind == "LocalQueue":
        return f"LocalQueue {name!r} does not exist; use another `queue`"
    return (
        f"ClusterQueue {name!r} of LocalQueue {queue.name!r} does not exist; ask {ADMIN} to "
        "create it, or use another `queue`"
    )


def _local_queue_inactive(queue: Queue) -> str:
    """The LocalQueue's Active=False, named with Kueue's reason; "" when active or unknown."""
    if queue.active is None or queue.active[0] != "False":
        return ""
    _, reason, message = queue.active
    lq, cq = queue.name, queue.cluster_queue or "?"
    if reason == CQ_DOES_NOT_EXIST:
        return (
            f"LocalQueue {lq!r} is inactive ({reason}): its ClusterQueue {cq!r} does not exist; "
            f"ask {ADMIN} to create it, or use another `queue`"
        )
    if reason == CQ_IS_INACTIVE:
        return (
            f"LocalQueue {lq!r} is inactive ({reason}): its ClusterQueue {cq!r} is stopped or "
            f"inactive and admits nothing until {ADMIN} restarts it"
        )
    if reason == STOPPED:
        return (
            f"LocalQueue {lq!r} is stopped ({reason}): it admits nothing until {ADMIN} restarts it"
        )
    return f"LocalQueue {lq!r} is inactive ({reason or 'no reason given'}): {message}".rstrip(": ")


def _deactivated(workload: Obj) -> str:
    """`spec.active: false`, with Kueue's reason when Kueue deactivated it itself."""
    name = (workload.get("metadata") or {}).get("name", "")
    evicted = _condition(workload, "Evicted") or {}
    said = str(evicted.get("message") or "") if evicted.get("status") == "True" else ""
    why = f": {said}" if said else ""
    return (
        f"its Workload {name} is deactivated (spec.active is false{why}); Kueue keeps it out of "
        "the queue until it is active again"
    )


def _condition(obj: Obj, type_: str) -> Obj | None:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(entry, Mapping) and entry.get("type") == type_:
            return entry
    return None


def local_queue_active(local_queue: Obj | None) -> tuple[str, str, str] | None:
    """A LocalQueue's Active condition as (status, reason, message), or None."""
    found = _condition(local_queue, ACTIVE) if local_queue is not None else None
    if found is None:
        return None
    return (
        str(found.get("status", "")),
        str(found.get("reason", "")),
        str(found.get("message", "")),
    )
