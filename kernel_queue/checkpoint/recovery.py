"""Which checkpoint a new kernel restores, and what the user is told about the others.

`recover` walks a store's checkpoints newest first: damaged and foreign ones are set aside (never
deleted), the first that loads whole is restored and marked, and `describe` says which one it
was, how old, and what it lacks next to a newer one that was lost. It never raises for a bad
checkpoint and never leaves part of one in the module.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from kernel_queue.checkpoint import (
    Candidate,
    CheckpointDamaged,
    CheckpointStore,
    Problem,
    Recovery,
    _age,
    load,
    summary,
)

LOST = ("damaged", "format", "failed")
"""Problem kinds that may have held newer state of the user's (a foreign one never did)."""


def recover(module: ModuleType, store: CheckpointStore, *, mark: bool = True) -> Recovery:
    """Restore the newest usable checkpoint of `store` into `module` (a fresh user module).

    Called by the kernel before it binds its ports. A checkpoint that fails to load leaves
    `module` as it was; the newest usable one already restored once is not restored again,
    unless a newer one was lost (then it is the best there is, and `describe` says so).
    `mark=False` leaves the marking to the caller (`store.mark_restored`): a kernel marks it
    once it runs code, so one killed before that restores the same state again.
    """
    problems: list[Problem] = []
    lost: Mapping[str, Any] | None = None  # the newest lost checkpoint's manifest, if readable
    lost_any = False
    for candidate in store.candidates():
        checkpoint = candidate.checkpoint
        if checkpoint is None:
            problems.append(_set_aside(store, candidate, candidate.kind, candidate.reason))
        elif candidate.restored and not lost_any:
            return Recovery(None, tuple(problems))
        else:
            original = dict(vars(module))
            try:
                report = load().restore(module, checkpoint)
            except CheckpointDamaged as exc:
                _reset(module, original)
                reason = str(exc.__cause__ or exc)
                problems.append(_set_aside(store, candidate, "damaged", reason))
            except Exception as exc:
                _reset(module, original)
                kind = "format" if "format" in type(exc).__name__.lower() else "failed"
                reason = f"{type(exc).__name__}: {exc}"
                problems.append(Problem(candidate.id, kind, reason, candidate.created))
            else:
                with contextlib.suppress(OSError):  # restored all the same
                    if mark:
                        store.mark_restored(checkpoint)
                return Recovery(report, tuple(problems), _lacks(lost, lost_any, report.restored))
        if problems[-1].kind in LOST and not lost_any:
            lost_any, lost = True, candidate.manifest
    return Recovery(None, tuple(problems), None if lost_any and lost is None else ())


def describe(recovery: Recovery) -> str:
    """The sentences users read about a recovery ("" when there was nothing to restore)."""
    notes = [_note(problem) for problem in recovery.problems]
    lost = any(problem.kind in LOST for problem in recovery.problems)
    report = recovery.report
    if report is None:
        if not notes:
            return ""
        if lost:
            return f"No checkpoint could be restored: {'; '.join(notes)}. The kernel starts empty."
        return f"{_capital('; '.join(notes))}. There was nothing else to restore."
    text = summary(report)
    if not notes:
        return text
    if not lost:
        return f"{_capital('; '.join(notes))}. {_capital(text)}"
    age = _age(report.age_seconds)
    older = f"Restored the older checkpoint {report.checkpoint.id} instead: {text}"
    if recovery.lacks is None:
        lacks = f"what the newer one held that it lacks cannot be told; its values are {age} old"
    elif recovery.lacks:
        names = ", ".join(recovery.lacks)
        lacks = f"it lacks {names}, which only the newer one saved; its other values are {age} old"
    else:
        lacks = f"its values are {age} old"
    return f"The newest checkpoint could not be restored: {'; '.join(notes)}. {older}; {lacks}."


def _set_aside(store: CheckpointStore, candidate: Candidate, kind: str, reason: str) -> Problem:
    """Move a damaged or foreign checkpoint out of the way; a "format" one stays in place."""
    if kind not in ("damaged", "foreign"):
        return Problem(candidate.id, kind, reason, candidate.created)
    aside = Candidate(candidate.id, candidate.path, candidate.created, None, kind, reason)
    try:
        moved = store.set_aside(aside)
    except OSError as exc:
        reason += f"; it could not be moved aside ({exc.strerror or exc})"
        return Problem(candidate.id, kind, reason, candidate.created)
    return Problem(candidate.id, kind, reason, candidate.created, moved)


def _lacks(
    lost: Mapping[str, Any] | None, lost_any: bool, restored: tuple[tuple[str, int], ...]
) -> tuple[str, ...] | None:
    """Names the lost checkpoint saved that the restored one lacks (None: cannot be told)."""
    if not lost_any:
        return ()
    saved = lost.get("saved") if lost is not None else None
    if not isinstance(saved, list):
        return None
    have = {name for name, _ in restored}
    names = (entry.get("name") for entry in saved if isinstance(entry, dict))
    return tuple(sorted({n for n in names if isinstance(n, str) and n not in have}))


def _note(problem: Problem) -> str:
    age = _age(max(0.0, time.time() - problem.created))
    moved = problem.moved_to
    if problem.kind == "foreign":
        where = f"; moved aside to {moved.name}" if moved else ""
        return (
            "a checkpoint not written by this kernel was found and ignored "
            f"({problem.id}: {problem.reason}{where})"
        )
    if problem.kind == "damaged":
        where = f"; it was moved aside to {moved.name} for inspection" if moved else ""
        return f"checkpoint {problem.id} ({age} old) is damaged: {problem.reason}{where}"
    if problem.kind == "format":
        return f"checkpoint {problem.id} ({age} old) cannot be read here: {problem.reason}"
    return f"checkpoint {problem.id} ({age} old) could not be loaded ({problem.reason})"


def _reset(module: ModuleType, original: dict[str, Any]) -> None:
    namespace = vars(module)
    namespace.clear()
    namespace.update(original)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]
