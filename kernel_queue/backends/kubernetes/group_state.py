"""The pure state machine of one pod group's record: what the kubernetes backend remembers of
a group that the cluster no longer shows, and what each new look at the cluster asks for.

Kueue owns a pod group's phase (queued, admitted, running, evicted, parking, parked): the backend
recomputes it from the informers' caches on every event. What it keeps is what those caches
cannot say again: whether Kueue made the group's Workload (its absence then means someone
deleted it), whether its head ever ran (a later pod exit is the kernel's end, not a failed
start), whether its failure was said, whether a round of replacement pods is being made, whether
a resume waits for the park to end, and whether its deletion began. `step(state, event)` answers
the next state and the actions `groups.Statuses` and `KubernetesBackend` carry out. Beside it,
`HeadLook`: how far the server got reaching the current head pod's kernel itself before the pod
is Ready. No I/O, no clock (how long unlisted replacement pods hold a wake back is the caller's
reading), no asyncio.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from kernel_queue.model import GroupPhase


class Stage(enum.StrEnum):
    """What the backend knows of one pod group's life beyond its phase."""

    SUBMITTED = "submitted"  # its objects are made; Kueue has made no Workload of it yet
    QUEUED = "queued"  # its Workload was seen; its head was never ready
    RAN = "ran"  # its head was ready once: a later end is the kernel's, not a failed start
    FAILED = "failed"  # failed before it ran: said once, with its pod's last log lines
    ENDING = "ending"  # its deletion began: no more statuses, no replacement pods, no wake
    ENDED = "ended"  # deleted and forgotten


class Done(enum.StrEnum):
    """What the backend tells the machine it did."""

    REPLACED = "replaced"  # a round of replacement pods was made (or its creation failed)
    END = "end"  # its deletion is asked (a stop, a release, a new launch of its kernel)
    DELETED = "deleted"  # its deletion ran to its end


@dataclass(frozen=True)
class Observed:
    """A new look at the cluster: the group's phase as computed from the caches, whether its
    Workload exists, whether its stopped pods wait for replacements, whether the last round's
    replacement pods are not listed yet (and still recent), and whether a FAILED phase is its
    queue never fitting it (said at once) rather than a pod's failure."""

    phase: GroupPhase
    workload: bool = False
    needs_replacement: bool = False
    unlisted: bool = False
    never_fits: bool = False


@dataclass(frozen=True)
class Park:
    """Park asked (only a running group parks)."""

    phase: GroupPhase


@dataclass(frozen=True)
class Resume:
    """Resume asked; `unlisted` as in `Observed`."""

    phase: GroupPhase
    unlisted: bool = False


@dataclass(frozen=True)
class Adopt:
    """A group found in the cluster after a server restart: whether it ran (a head that is
    ready, a parked Workload, or no pods to tell): assumed until its pods are read."""

    ran: bool


Event = Observed | Park | Resume | Adopt | Done


class Action(enum.StrEnum):
    """What the backend must do after a transition."""

    PUBLISH = "publish"  # tell watchers the status just computed
    SAY_FAILURE = "say-failure"  # publish the failure once, with its pod's last log lines
    REPLACE = "replace"  # make a round of replacement pods
    WAKE = "wake"  # set its Workload active again
    DEACTIVATE = "deactivate"  # set its Workload inactive (park)
    REFRESH = "refresh"  # look again: a wake held back for a replacement round may go on
    DELETE = "delete"  # delete its Workload and pods (once; later callers wait for it)


_S, _A = Stage, Action
LIVE = frozenset({_S.SUBMITTED, _S.QUEUED, _S.RAN, _S.FAILED})
"""Stages whose statuses are computed, published and acted on."""


@dataclass(frozen=True)
class State:
    """One pod group's stage, and the two things in flight beside it: a round of replacement
    pods being made (`replacing`), and a resume that waits until the group is parked with its
    replacement pods listed (`wake`); a wake made then would have Kueue admit the group with
    only the pod that stopped, read as the kernel ending."""

    stage: Stage = Stage.SUBMITTED
    replacing: bool = False
    wake: bool = False

    @property
    def had_workload(self) -> bool:
        """Kueue made its Workload before: its absence now means someone deleted it."""
        return self.stage in (_S.QUEUED, _S.RAN, _S.FAILED)

    @property
    def ran(self) -> bool:
        """Its head was ready before."""
        return self.stage is _S.RAN

    @property
    def ending(self) -> bool:
        """Its deletion began (or is done)."""
        return self.stage in (_S.ENDING, _S.ENDED)


@dataclass(frozen=True)
class Transition:
    """The outcome of one `step`."""

    state: State
    actions: frozenset[Action]


_NOTHING = frozenset[Action]()


def step(current: State, event: Event) -> Transition:
    """Apply one event. A group whose deletion began takes nothing but `Done` (its round of
    replacement pods ends, its deletion ends)."""
    if isinstance(event, Done):
        return _done(current, event)
    if current.ending:
        return Transition(current, _NOTHING)
    if isinstance(event, Observed):
        return _observed(current, event)
    if isinstance(event, Park):
        if event.phase is not GroupPhase.RUNNING:
            return Transition(current, _NOTHING)
        return Transition(replace(current, wake=False), frozenset({_A.DEACTIVATE}))
    if isinstance(event, Resume):
        if event.phase is GroupPhase.PARKING or current.replacing or event.unlisted:
            return Transition(replace(current, wake=True), _NOTHING)  # woken once parked
        if event.phase is GroupPhase.PARKED:
            return Transition(current, frozenset({_A.WAKE}))
        return Transition(current, _NOTHING)
    if current.stage in (_S.SUBMITTED, _S.QUEUED, _S.RAN):  # Adopt
        return Transition(replace(current, stage=_S.RAN if event.ran else _S.QUEUED), _NOTHING)
    return Transition(current, _NOTHING)


def _observed(current: State, seen: Observed) -> Transition:
    stage, replacing, wake = current.stage, current.replacing, current.wake
    actions: set[Action] = set()
    if stage is _S.SUBMITTED and (seen.workload or seen.phase is GroupPhase.RUNNING):
        stage = _S.QUEUED
    if stage is _S.QUEUED and seen.phase is GroupPhase.RUNNING:
        stage = _S.RAN
    # Until the informer lists what the last round made, the group still reads as needing
    # replacements: a round made then is an excess pod Kueue deletes.
    if seen.needs_replacement and not (replacing or seen.unlisted):
        replacing = True
        actions.add(_A.REPLACE)
    if seen.phase is GroupPhase.PARKED and wake and not (replacing or seen.unlisted):
        wake = False
        actions.add(_A.WAKE)
    if seen.phase is GroupPhase.FAILED and not seen.never_fits:
        if stage is not _S.FAILED:  # said once, by the task that adds the pod's log lines
            stage = _S.FAILED
            actions.add(_A.SAY_FAILURE)
    else:
        actions.add(_A.PUBLISH)
    return Transition(State(stage, replacing, wake), frozenset(actions))


def _done(current: State, done: Done) -> Transition:
    if done is Done.REPLACED:
        state = replace(current, replacing=False)
        again = current.wake and not current.ending
        return Transition(state, frozenset({_A.REFRESH}) if again else _NOTHING)
    if done is Done.END:
        if current.ending:
            return Transition(current, _NOTHING)
        return Transition(State(_S.ENDING, current.replacing), frozenset({_A.DELETE}))
    if current.stage is _S.ENDING:
        return Transition(replace(current, stage=_S.ENDED, wake=False), _NOTHING)
    return Transition(current, _NOTHING)


class Look(enum.StrEnum):
    """How far the server got reaching one head pod's kernel before the pod's Ready."""

    NONE = "none"  # not tried (or a try ended without an answer: tried again on the next look)
    LOOKING = "looking"  # a try runs (`groups.Statuses._look`)
    REACHED = "reached"  # its kernel answered: the group runs though the pod is not Ready yet
    READY = "ready"  # the pod was seen Ready: its readiness speaks from then on (a restart)


@dataclass(frozen=True)
class HeadLook:
    """The server's own look at the group's current head pod (`uid`); a new head pod (a
    replacement) starts at `Look.NONE`. Pure: the caller starts and ends the tries."""

    uid: str = ""
    look: Look = Look.NONE

    def _of(self, uid: str) -> Look:
        return self.look if uid == self.uid else Look.NONE

    def seen_ready(self, uid: str) -> HeadLook:
        """The pod `uid` is Ready."""
        return HeadLook(uid, Look.READY)

    def start(self, uid: str) -> HeadLook | None:
        """A try at the started, not Ready pod `uid`: the new state, or None when none is due
        (one runs, its kernel answered, or the pod was Ready before)."""
        return HeadLook(uid, Look.LOOKING) if self._of(uid) is Look.NONE else None

    def answered(self, uid: str) -> HeadLook:
        """The try at `uid` reached its kernel (nothing, if that pod is no longer looked at)."""
        return HeadLook(uid, Look.REACHED) if self._of(uid) is Look.LOOKING else self

    def ended(self, uid: str) -> HeadLook:
        """The try at `uid` ended without an answer (the pod changed, the group ended)."""
        return HeadLook(uid, Look.NONE) if self._of(uid) is Look.LOOKING else self

    @property
    def reached(self) -> str:
        """The head pod whose kernel answered before its Ready, or ""."""
        return self.uid if self.look is Look.REACHED else ""
