"""The system service's per-user rules, applied: which priority a submit gets, how many GPUs a
user may hold at once, and what of a listing each user sees.

Pure functions over the config (`config.py`) and protocol values; `service.py` calls them.
A user's own service has no config: every rule is "no limit" and every group is the user's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kernel_queue import admission
from kernel_queue.machine import config, protocol

MAX_GRACE_SECONDS = 600.0
"""The longest a system service lets a preempted kernel keep its GPUs: a client's own grace
beyond it would let a user sit out every preemption."""

WATCHING = (
    "this connection only watches the queue (its hello said watch); connect again with a "
    "quota to submit"
)


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def check_submit(
    system: config.SystemConfig, who: config.Identity, submit: protocol.Submit
) -> protocol.Submit | str:
    """`submit` with the priority class and priority the machine's config gives it and its
    grace at most MAX_GRACE_SECONDS (the client's own numbers are not trusted), or the sentence
    refusing it."""
    rule = system.rule_for(who)
    classes = system.quota.priority_classes
    klass = submit.priority_class or rule.default_priority_class
    if klass is not None and klass not in classes:
        known = ", ".join(sorted(classes)) or "none"
        return (
            f"priority class {klass!r} does not exist on this machine (its classes: {known}, "
            f"in {system.path}); name one of those in the kernelspec's priority_class"
        )
    if (
        klass is not None
        and rule.priority_classes is not None
        and klass not in rule.priority_classes
    ):
        allowed = ", ".join(rule.priority_classes) or "none"
        return (
            f"{who.user} may not use priority class {klass!r} on this machine (allowed: "
            f"{allowed}, by {system.path}); pick one of those, or ask the machine's "
            "administrator to allow it"
        )
    wanted = submit.resources.get("gpu", 0)
    if rule.max_gpus is not None and wanted > rule.max_gpus:
        return (
            f"{who.user} may hold at most {_gpus(rule.max_gpus)} at once on this machine (by "
            f"{system.path}) and this kernel needs {_gpus(wanted)}; ask for fewer, or ask the "
            "machine's administrator to raise max_gpus"
        )
    priority = 0 if klass is None else classes[klass]
    grace = min(submit.grace, MAX_GRACE_SECONDS)
    return replace(submit, priority_class=klass, priority=priority, grace=grace)


def limit_reason(who: config.Identity, held: int, limit: int) -> str:
    """Why a group of `who` waits though GPUs may be free: its user holds its limit."""
    allowed = "GPU" if limit == 1 else "GPUs"
    return (
        f"{who.user} already holds {held} of the {limit} {allowed} allowed at once; "
        f"it starts when one of {who.user}'s kernels stops"
    )


def for_viewer(
    entries: Iterable[protocol.Entry], uid: int, privacy: str
) -> tuple[tuple[protocol.Entry, ...], dict[str, int]]:
    """What the user `uid` sees of `entries`: its own in full; another user's without its
    group, kernel id and pid ("names"), or only counted by state ("counts")."""
    shown: list[protocol.Entry] = []
    hidden: dict[str, int] = {}
    for entry in entries:
        if entry.uid == uid:
            shown.append(entry)
        elif privacy == "counts":
            hidden[entry.state] = hidden.get(entry.state, 0) + 1
        else:
            shown.append(replace(entry, group="", kernel_id="", pid=0))
    return tuple(shown), hidden


def not_yours(name: str, verb: str, holder: str, pid: int, same_user: bool) -> str:
    """Why a client may not release or requeue (`verb`) the group `name` of another client."""
    if same_user:
        return (
            f"group {name} belongs to another connection of {holder} (pid {pid}); only that "
            f"server can {verb} it"
        )
    return (
        f"group {name} is another user's; only its own server can {verb} it (on this machine "
        "another user's GPUs change hands only by preemption)"
    )


def already_queued(name: str, pid: int, same_user: bool) -> str:
    """Why a submit of a group name another client queued is refused."""
    by = f"another client (pid {pid})" if same_user else "another user"
    return f"group {name} is already queued by {by}"


def places(waiting: list[admission.Request]) -> dict[str, tuple[int, int]]:
    """Each waiting request's 1-based place in its queue and the queue's length, in the
    engine's order (as `admission.schedule`'s positions)."""
    lengths: dict[str, int] = {}
    for request in waiting:
        lengths[request.queue] = lengths.get(request.queue, 0) + 1
    seen: dict[str, int] = {}
    found = {}
    for request in admission.order(waiting):
        seen[request.queue] = seen.get(request.queue, 0) + 1
        found[request.name] = (seen[request.queue], lengths[request.queue])
    return found


@dataclass(frozen=True)
class Holding:
    """A group as its user's GPU limit sees it: its user, the GPUs it asks for, the limit."""

    name: str
    uid: int
    gpus: int
    max_gpus: int | None


def past_limits(groups: Iterable[Holding], held: Counter[int], each: bool = False) -> set[str]:
    """Which of `groups`, admitted in this order on top of what each uid `held`, would take
    their user past max_gpus (`each`: each group alone on top of `held`)."""
    total, past = Counter(held), set()
    for group in groups:
        if group.max_gpus is not None and total[group.uid] + group.gpus > group.max_gpus:
            past.add(group.name)
        elif not each:
            total[group.uid] += group.gpus
    return past


def preempted_by(preemptor: protocol.Submit) -> str:
    """What a preempted kernel is told of the kernel that takes its GPUs."""
    klass = preemptor.priority_class
    by = f"kernel {_short(preemptor.kernel_id)}" + (f" (priority {klass!r})" if klass else "")
    return f"preempted by higher-priority {by}, which needs {preemptor.needs}"


def _short(kernel_id: str) -> str:
    return kernel_id.replace("-", "")[:8].lower()  # as model.short_id
