"""The pure state machine of one local group: what the machine's queue, the session and the
launcher's life do to it.

The local backend drives its kernels itself (it starts and signals each launcher), so a group's
stage is the whole truth about it: `step(state, event)` answers the next state and the actions
`LocalBackend` carries out (signals, requeues, the end). No I/O, no clock, no asyncio.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Stage(enum.StrEnum):
    """Where one local group is in its life."""

    QUEUED = "queued"  # waits in the machine's queue, its ports held
    ADMITTED = "admitted"  # admitted; its launcher is not started yet
    RUNNING = "running"  # its launcher runs
    EVICTING = "evicting"  # preempted (or its GPUs reclaimed): its launcher saves and exits
    PARKING = "parking"  # its launcher saves and exits; then it waits outside the queue
    PARKING_WAKE = "parking-wake"  # parking, and a resume came: queued again once parked
    PARKED = "parked"  # no launcher, no admission, not in the queue; its ports held
    INTERRUPTED = "interrupted"  # its launcher died unasked: its kernel is buried, then it queues
    ENDING = "ending"  # stopped or released: its launcher stops, then the group ends
    LOST = "lost"  # the machine's queue ended its lease: its launcher is killed, then it fails
    ENDED = "ended"


class Event(enum.StrEnum):
    """What happens to a local group."""

    ADMIT = "admit"  # the machine's queue admitted it
    LAUNCH = "launch"  # its launcher process was started
    PREEMPT = "preempt"  # the machine's queue wants its GPUs back
    RECLAIM = "reclaim"  # the machine's queue reclaimed its GPUs: its launcher outlived its grace
    PARK = "park"
    RESUME = "resume"
    STOP = "stop"  # a stop (not a restart in place) or a release
    LEASE_LOST = "lease-lost"  # the machine's queue refused it, or its lease ended
    EXITED = "exited"  # its launcher exited (the kernel's own end, or one of ours)
    LAUNCHER_LOST = "launcher-lost"  # its running launcher was killed unasked (a signal)
    BURIED = "buried"  # the lost launcher's kernel is gone: it may queue again
    END = "end"  # the backend ends it: it cannot start, it was lost too often, it is released


class Action(enum.StrEnum):
    """What `LocalBackend` must do after a transition."""

    START = "start"  # start its launcher (its run task)
    SAY_EVICTED = "say-evicted"  # tell watchers it is evicted, and why
    SAY_PARKING = "say-parking"  # tell watchers it is parking
    TERM = "term"  # note why for the kernel, then SIGTERM its launcher (the kernel saves)
    KILL_AFTER = "kill-after"  # SIGKILL its launcher if it outlives its grace
    STOP = "stop"  # stop its launcher as asked (SIGTERM, killed after grace; or SIGKILL)
    KILL = "kill"  # SIGKILL its launcher
    REQUEUE = "requeue"  # back at the end of its queue (no launcher, no admission)
    PARKED = "parked"  # say it is parked and give its GPUs to the next in line
    WAKE = "wake"  # submit it again at the end of its queue
    BURY = "bury"  # make sure its lost launcher's kernel is gone
    END = "end"  # free its ports and queue place, tell watchers it ended, forget it


_S, _E, _A = Stage, Event, Action
LEAVING = frozenset({_S.EVICTING, _S.PARKING, _S.PARKING_WAKE})
"""Stages whose launcher stops to give back its admission."""
WITH_LAUNCHER = LEAVING | {_S.RUNNING, _S.ENDING, _S.LOST}
"""Stages with a launcher process."""
HOLDING = WITH_LAUNCHER | {_S.ADMITTED, _S.INTERRUPTED}
"""Stages that hold an admission (the machine's queue counts its GPUs as theirs)."""


@dataclass(frozen=True)
class State:
    """One group's stage, and whether its launcher was asked to give back its admission
    (preempted, reclaimed, parking; still so when a stop or a lost lease follows): then its
    kernel's start and exit are no news to its watchers."""

    stage: Stage = Stage.QUEUED
    leaving: bool = False


@dataclass(frozen=True)
class Transition:
    """The outcome of one `step`."""

    state: State
    actions: frozenset[Action]


# (stage, event) -> (next stage, actions). Pairs not listed change nothing and do nothing.
_TABLE: dict[tuple[Stage, Event], tuple[Stage, frozenset[Action]]] = {}


def _rows(
    stages: tuple[Stage, ...] | frozenset[Stage], event: Event, to: Stage | None, *acts: Action
) -> None:
    """`to` None: each stage stays where it is."""
    for stage in stages:
        _TABLE[(stage, event)] = (stage if to is None else to, frozenset(acts))


_rows((_S.QUEUED,), _E.ADMIT, _S.ADMITTED, _A.START)
_rows((_S.ADMITTED,), _E.LAUNCH, _S.RUNNING)
# Preempted: a running kernel saves, and is requeued once its launcher exited; one not started
# yet goes back at once. A group already giving back its admission, or ending, needs no more.
_rows((_S.RUNNING,), _E.PREEMPT, _S.EVICTING, _A.SAY_EVICTED, _A.TERM)
_rows((_S.ADMITTED,), _E.PREEMPT, _S.QUEUED, _A.SAY_EVICTED, _A.REQUEUE)
# Its launcher outlived the grace of a preemption (or parking): killed, whatever it was doing.
_rows((_S.RUNNING,), _E.RECLAIM, _S.EVICTING, _A.KILL)
_rows(WITH_LAUNCHER - {_S.RUNNING}, _E.RECLAIM, None, _A.KILL)
# Parking only a running kernel; a resume while it parks wakes it once it is parked.
_rows((_S.RUNNING,), _E.PARK, _S.PARKING, _A.SAY_PARKING, _A.TERM, _A.KILL_AFTER)
_rows((_S.PARKING, _S.PARKING_WAKE), _E.RESUME, _S.PARKING_WAKE)
_rows((_S.PARKED,), _E.RESUME, _S.QUEUED, _A.WAKE)
# A stop ends a group without a launcher at once; one with a launcher once it exited.
_rows((_S.QUEUED, _S.ADMITTED, _S.PARKED, _S.INTERRUPTED), _E.STOP, _S.ENDED, _A.END)
_rows((_S.RUNNING, *LEAVING, _S.ENDING), _E.STOP, _S.ENDING, _A.STOP)
_rows((_S.LOST,), _E.STOP, _S.LOST, _A.STOP)
_rows((_S.QUEUED, _S.ADMITTED, _S.PARKED, _S.INTERRUPTED), _E.LEASE_LOST, _S.ENDED, _A.END)
_rows(WITH_LAUNCHER, _E.LEASE_LOST, _S.LOST, _A.KILL)
# Its launcher exited: what follows depends on why it was stopping.
_rows((_S.RUNNING, _S.ENDING, _S.LOST), _E.EXITED, _S.ENDED, _A.END)
_rows((_S.EVICTING,), _E.EXITED, _S.QUEUED, _A.REQUEUE)
_rows((_S.PARKING,), _E.EXITED, _S.PARKED, _A.PARKED)
_rows((_S.PARKING_WAKE,), _E.EXITED, _S.QUEUED, _A.PARKED, _A.WAKE)
# Killed unasked while it ran: a pause, not the end (the backend bounds how often).
_rows((_S.RUNNING,), _E.LAUNCHER_LOST, _S.INTERRUPTED, _A.BURY)
_rows((_S.INTERRUPTED,), _E.BURIED, _S.QUEUED, _A.REQUEUE)
_rows(tuple(s for s in Stage if s is not _S.ENDED), _E.END, _S.ENDED, _A.END)


def step(current: State, event: Event) -> Transition:
    """Apply one event; pairs the table does not list (and everything once ENDED) change
    nothing. `leaving` holds from the moment a launcher is asked to give back its admission
    until the group has no launcher."""
    row = _TABLE.get((current.stage, event))
    if row is None:
        return Transition(current, frozenset())
    stage, actions = row
    ends_its_launcher = stage in (_S.ENDING, _S.LOST)
    leaving = stage in LEAVING or (
        ends_its_launcher and (current.leaving or current.stage in LEAVING or event is _E.RECLAIM)
    )
    return Transition(State(stage, leaving), actions)
