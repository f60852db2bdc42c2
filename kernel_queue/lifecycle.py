"""The pure state machine of one queued kernel, and the sentences that describe each state.

`step(lifecycle, observation)` maps what a backend reported (a `GroupPhase`) or what the
kernel's session decided (a `Command`) to the next state and the actions the session must carry
out (`tracking.py` does). No I/O, no clock, no backend knowledge.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kernel_queue import wait_estimate
from kernel_queue.model import GroupPhase, GroupStatus, Waiting


class KernelState(enum.StrEnum):
    """What a user is told about their kernel."""

    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    RESUMED = "resumed"
    RESTARTING = "restarting"  # the kernel process restarts in place; the admission is kept
    PARKED = "parked"  # idle, saved, its admission given back; its next cell brings it back
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({KernelState.FINISHED, KernelState.FAILED, KernelState.CANCELLED})
WAITING = frozenset({KernelState.QUEUED, KernelState.PREEMPTED, KernelState.REQUEUED})
LIVE = frozenset({KernelState.RUNNING, KernelState.RESUMED})
IN_PLACE = LIVE | {KernelState.RESTARTING}
"""States of a kernel that holds its admission and a kernel process (or gets a new one)."""
CANCELLABLE = WAITING | {KernelState.ADMITTED}
"""States of a launch that a shutdown cancels: it has not reached a running kernel."""


class Command(enum.StrEnum):
    """Observations that come from the provisioner rather than the backend."""

    CANCEL = "cancel"  # the user shut the kernel down while it waited
    ADMISSION_TIMEOUT = "admission-timeout"
    STARTUP_TIMEOUT = "startup-timeout"
    RESTART = "restart"  # a restart in place was asked for (jupyter's shutdown_request)
    RESTARTED = "restarted"  # the new kernel process of an in-place restart answers


class Action(enum.StrEnum):
    """What the session must do after a transition, besides telling the user what changed
    (every observation may change the sentence; the session tells only a new one)."""

    RELEASE = "release"  # free the queue place or quota and delete what was created
    FAIL = "fail"  # a waiting launch raises; a live kernel is reported dead


Observation = GroupPhase | Command


@dataclass(frozen=True)
class Lifecycle:
    """One kernel's state, how often it was preempted and parked, and whether it is waking
    from a park (waiting to come back because its user came back, not because of a preemption)."""

    state: KernelState = KernelState.QUEUED
    preemptions: int = 0
    parks: int = 0
    waking: bool = False


@dataclass(frozen=True)
class Transition:
    """The outcome of one `step`."""

    lifecycle: Lifecycle
    actions: frozenset[Action]


_R, _F = Action.RELEASE, Action.FAIL
_S = KernelState
_P = GroupPhase

# (state, observation) -> (next state, actions). Pairs not listed leave the state unchanged and
# do nothing. A preemption is counted when entering PREEMPTED (or REQUEUED without PREEMPTED).
# RUNNING stands for RESUMED once the kernel was preempted (see `step`).
_TABLE: dict[tuple[KernelState, Observation], tuple[KernelState, frozenset[Action]]] = {}


def _rows(
    states: tuple[KernelState, ...], observed: Observation, to: KernelState, *acts: Action
) -> None:
    for state in states:
        _TABLE[(state, observed)] = (to, frozenset(acts))


_BEFORE_LIVE = (_S.QUEUED, _S.ADMITTED)
_AFTER_PREEMPTION = (_S.PREEMPTED, _S.REQUEUED)
_LIVE = (_S.RUNNING, _S.RESUMED)
_IN_PLACE = (*_LIVE, _S.RESTARTING)
_rows((_S.QUEUED,), _P.PENDING, _S.QUEUED)
_rows((_S.QUEUED,), _P.QUEUED, _S.QUEUED)
_rows((_S.ADMITTED,), _P.QUEUED, _S.QUEUED)
_rows((_S.QUEUED,), _P.ADMITTED, _S.ADMITTED)
_rows(_BEFORE_LIVE, _P.RUNNING, _S.RUNNING)
_rows(_BEFORE_LIVE, _P.EVICTED, _S.PREEMPTED)
_rows(_BEFORE_LIVE, _P.FINISHED, _S.FAILED, _F, _R)
_rows(_BEFORE_LIVE, Command.STARTUP_TIMEOUT, _S.FAILED, _F, _R)
# The queue wait of a launch is bounded also when the kernel was preempted before it first ran.
_rows((_S.QUEUED, *_AFTER_PREEMPTION), Command.ADMISSION_TIMEOUT, _S.FAILED, _F, _R)
_rows(_BEFORE_LIVE + _AFTER_PREEMPTION, Command.CANCEL, _S.CANCELLED, _F, _R)
_rows(_BEFORE_LIVE + _AFTER_PREEMPTION + _IN_PLACE, _P.FAILED, _S.FAILED, _F, _R)
_rows(_IN_PLACE, _P.EVICTED, _S.PREEMPTED)
_rows(_IN_PLACE, _P.QUEUED, _S.REQUEUED)
_rows(_IN_PLACE, _P.FINISHED, _S.FINISHED)
# A restart in place keeps the admission: the group stays RUNNING while its process restarts.
_rows(_LIVE, Command.RESTART, _S.RESTARTING)
_rows((_S.RESTARTING,), Command.RESTARTED, _S.RUNNING)
_rows((_S.RESTARTING,), Command.STARTUP_TIMEOUT, _S.FAILED, _F, _R)
_rows(_AFTER_PREEMPTION, _P.PENDING, _S.REQUEUED)
_rows(_AFTER_PREEMPTION, _P.QUEUED, _S.REQUEUED)
_rows(_AFTER_PREEMPTION, _P.ADMITTED, _S.ADMITTED)
_rows(_AFTER_PREEMPTION, _P.RUNNING, _S.RESUMED)
_rows(_AFTER_PREEMPTION, _P.FINISHED, _S.FINISHED)  # stopped while waiting to come back
# Parking: the kernel saves and gives its admission back; the group stays and comes back through
# the queue (REQUEUED, as after a preemption, but counted as a park: `waking`).
_PARK = (_P.PARKING, _P.PARKED)
for _phase in _PARK:
    # QUEUED: a group adopted after a restart (a tracker begins there) found parked.
    _rows((_S.QUEUED, *_IN_PLACE, _S.PARKED), _phase, _S.PARKED)
_rows((_S.PARKED,), _P.PENDING, _S.REQUEUED)
_rows((_S.PARKED,), _P.QUEUED, _S.REQUEUED)
_rows((_S.PARKED,), _P.ADMITTED, _S.ADMITTED)
_rows((_S.PARKED,), _P.RUNNING, _S.RESUMED)
_rows((_S.PARKED,), _P.FINISHED, _S.FINISHED)
_rows((_S.PARKED,), _P.FAILED, _S.FAILED, _F, _R)


def step(current: Lifecycle, observed: Observation) -> Transition:
    """Apply one observation. Terminal states absorb everything; unknown pairs change nothing.

    An ADMITTED kernel that was preempted before becomes RESUMED (not RUNNING) once running.
    """
    row = _TABLE.get((current.state, observed))
    if row is None:
        return Transition(current, frozenset())
    state, actions = row
    preemptions, parks, waking = current.preemptions, current.parks, current.waking
    if state is _S.RUNNING and (preemptions or parks):
        state = _S.RESUMED
    if state is _S.PREEMPTED or (state is _S.REQUEUED and current.state in IN_PLACE):
        preemptions += 1
        waking = False  # preempted (again): it waits because of the queue, not its user
    if state is _S.PARKED and current.state is not _S.PARKED:
        parks += 1
    if current.state is _S.PARKED and state is not _S.PARKED:
        waking = state not in TERMINAL
    if state in LIVE:
        waking = False
    return Transition(Lifecycle(state, preemptions, parks, waking), actions)


def shown(lifecycle: Lifecycle) -> KernelState:
    """The state users are told: a kernel restarting in place is still the running (or
    resumed) kernel it was, as far as its queue is concerned."""
    if lifecycle.state is _S.RESTARTING:
        return _S.RESUMED if lifecycle.preemptions else _S.RUNNING
    return lifecycle.state


def describe(
    lifecycle: Lifecycle,
    status: GroupStatus,
    *,
    queue: str,
    needs: str,
    restored: bool = False,
    parked: str = "",
    gpus: int = 0,
) -> str:
    """The sentence shown as the kernel's `reason` and in status events. `restored`: the kernel
    checkpoints when preempted and restores when it resumes. `parked`: why it was parked
    ("after 30 min idle", "on request"); `gpus`: how many GPUs it holds when admitted."""
    state = shown(lifecycle)
    place = status.place
    where = f"in '{queue}'"
    if place is not None and place.position:
        where = f"in '{place.queue}', position {place.position} of {place.length}"
    elif place is not None:  # the count is known but not the order (no visibility API)
        where = f"in '{place.queue}', one of {place.length} waiting"
    on = _devices(status)
    need = f", needs {needs}" if needs else ""  # unknown for a group adopted after a restart
    waiting = status.waiting or Waiting()
    if state is _S.QUEUED and not waiting.answered:
        need = f" (needs {needs})" if needs else ""
        return f"Kueue does not answer: {waiting.why} The kernel keeps waiting for '{queue}'{need}."
    why = "".join(
        f"; {part}" for part in (waiting.why, wait_estimate.describe(waiting.estimate)) if part
    )
    if state is _S.QUEUED:
        return f"queued {where}{need}{why}"
    if state is _S.PARKED:
        return _parked(status, parked or "on request", gpus, restored)
    if state is _S.REQUEUED and lifecycle.waking:
        return f"waking from parked: queued {where}{need}{why}"
    if state is _S.REQUEUED and status.interrupted:
        then = "to come back from its last checkpoint" if restored else "to start again fresh"
        return (
            f"stopped without warning ({status.interrupted}); requeued {where}{need}{why}, {then}"
        )
    if state is _S.REQUEUED:
        saved = f" ({status.message})" if status.message else ""  # what the checkpoint saved
        return f"preempted{saved}; requeued {where}{need}{why}"
    if state is _S.ADMITTED:
        flavor = f" on flavor '{status.flavor}'" if status.flavor else ""
        return f"admitted{flavor}{on}; starting the kernel"
    if state is _S.RUNNING:
        return f"running{on}"
    if state is _S.PREEMPTED:
        said = status.message  # the backend's or Kueue's sentence, often "Preempted …" itself
        why = said if said.lower().startswith("preempted") else f"preempted: {said}".rstrip(": ")
        then = "saving its variables, then waiting" if restored else "the kernel will wait"
        return f"{why}; {then} in '{queue}' again"
    if state is _S.RESUMED:
        if restored:
            return f"resumed{on}; variables restored from the checkpoint (the notebook lists them)"
        return f"resumed{on}; the kernel restarted fresh, variables were not restored"
    if state is _S.FINISHED:
        return f"finished with exit code {status.exit_code}"
    if state is _S.CANCELLED:
        return f"cancelled while waiting in '{queue}'"
    return status.message or "failed"


def _parked(status: GroupStatus, why: str, gpus: int, restored: bool) -> str:
    held = f"{gpus} GPUs" if gpus > 1 else "GPU" if gpus else "queue place"
    if status.phase is _P.PARKING:
        return f"parking {why}: saving its variables, then giving back its {held}"
    if restored:
        saved = f" ({status.message})" if status.message else ""
        back = f"your next cell brings it back{saved}"
    else:
        back = "your next cell brings it back with fresh variables (checkpoints are off)"
    return f"parked {why}; {held} released; {back}"


def idle_words(seconds: float) -> str:
    """How long a kernel sat idle, as its parked reason says it: "45 s", "30 min", "2 h"."""
    if seconds < 90:
        return f"{round(seconds)} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f}".removesuffix(".0") + " h"


def _devices(status: GroupStatus) -> str:
    if not status.devices:
        return ""
    label = "GPU" if len(status.devices) == 1 else "GPUs"
    return f" with {label} {', '.join(status.devices)}"
