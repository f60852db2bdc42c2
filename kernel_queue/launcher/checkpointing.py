"""The kernel side of checkpoints: their inputs, and the restore at start.

``kernel.py`` uses it only when ``KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR`` is set: ``Options`` reads
the inputs (the secret from the connection key), ``prepare`` restores the newest checkpoint into
a fresh ``__main__`` before any port is bound and returns the ``preemption.Preemption`` that
``install`` arms for SIGTERM; the kernel's request hooks show the summaries.
"""

from __future__ import annotations

import json
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel_queue import checkpoint
from kernel_queue.launcher import continuous, contract, preemption

MAX_NAMES = 40
"""Restored names listed in the restore message; the rest are counted."""


@dataclass(frozen=True)
class Options:
    """The kernel's checkpoint inputs: ``contract.Checkpointing`` and what the launcher adds."""

    directory: str
    deadline: float = contract.DEFAULT_BUDGET.save_deadline
    keep: bool = False
    report: str | None = None
    generation: int = 0
    continuous: bool = True
    """Also checkpoint after each cell, in the background (``continuous``)."""
    secret: bytes | None = field(default=None, repr=False)
    """Signs this kernel's checkpoints and tells its own from planted ones; derived from the
    connection key (``checkpoint.derive_secret``), so only this kernel holds it."""

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], connection_file: str | None = None
    ) -> Options | None:
        """None when checkpointing is off; ``contract.SettingsError`` for a bad input.

        The secret comes from the key in ``connection_file`` (the kernel's ``-f`` argument;
        the launcher keeps the key out of the environment). Without a key checkpoints carry a
        checksum only, which is logged.
        """
        inputs = contract.parse_checkpointing(environ)
        if inputs is None:
            return None
        return cls(
            directory=inputs.directory,
            deadline=inputs.deadline,
            keep=inputs.keep,
            report=inputs.report,
            generation=contract.parse_generation(environ) or 0,
            continuous=inputs.continuous,
            secret=_secret(connection_file),
        )


def _secret(connection_file: str | None) -> bytes | None:
    """The checkpoint secret derived from the connection file's key; None (logged) without."""
    try:
        with open(connection_file or "", encoding="utf-8") as file:
            key = json.load(file).get("key", "")
    except (OSError, ValueError, AttributeError) as exc:
        preemption.log(f"checkpoints are not authenticated: no connection file key ({exc!r})")
        return None
    if not isinstance(key, str) or not key:
        preemption.log("checkpoints are not authenticated: the connection file has no key")
        return None
    return checkpoint.derive_secret(key.encode())


def prepare(options: Options) -> preemption.Preemption:
    """Restore the newest usable checkpoint into a new ``__main__``; call before ``initialize``.

    In ipykernel 7.4 the InteractiveShell is created in ``init_kernel``, after ``init_sockets``
    bound the ports, so the state is restored into the module the shell will then adopt as its
    ``user_module``: no port is bound while a checkpoint loads. Only generation 0 restores.
    A damaged, foreign or unloadable checkpoint is set aside or skipped by
    ``checkpoint.recover``, and the notebook is told which one was restored instead, if any.
    """
    store = checkpoint.DirectoryStore(options.directory, secret=options.secret)
    module = types.ModuleType("__main__")
    if options.generation != 0:
        return preemption.Preemption(options, store, module, None)
    started = time.monotonic()
    try:
        recovery = checkpoint.recover(module, store, mark=False)
    except Exception as exc:  # e.g. an unreadable store: the kernel must start all the same
        preemption.log(f"restore failed: {exc!r}")
        sentence = f"The saved state could not be restored ({exc}); the kernel starts empty."
        return preemption.Preemption(options, store, types.ModuleType("__main__"), sentence)
    for problem in recovery.problems:
        preemption.log(f"checkpoint {problem.id} not restored ({problem.kind}): {problem.reason}")
    if recovery.report is not None:
        seconds = time.monotonic() - started
        preemption.log(f"restored checkpoint {recovery.report.checkpoint.id} in {seconds:.2f} s")
    activity = continuous.read_activity(store.root)
    hooks = preemption.Preemption(options, store, module, _restore_message(recovery, activity))
    if recovery.report is not None:  # marked once code runs: a kernel killed before restores it
        hooks.restored = recovery.report.checkpoint
    return hooks


def _restore_message(
    recovery: checkpoint.Recovery, activity: tuple[int | None, float] | None = None
) -> str | None:
    """The library's sentences, then the restored names and why the others were not saved;
    None when there was nothing to restore and nothing to tell. A checkpoint taken after a
    cell (not on SIGTERM) means the kernel stopped without warning: say which cell it holds,
    and how much older it is than the last cell that ended (``activity``)."""
    text = checkpoint.summary(recovery)
    report = recovery.report
    if report is None:
        return text or None
    manifest = report.checkpoint.manifest
    if manifest.get("trigger") == continuous.TRIGGER and not recovery.problems:
        text = _after_kill(report, manifest.get("cell"), activity)
    names = sorted(name for name, _ in report.restored)
    more = f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else ""
    lines = [text]
    lines += [f"Restored: {', '.join(names[:MAX_NAMES])}{more}."] if names else []
    lines += [f"{name} was not saved: {why}" for name, _, why in report.skipped]
    return "\n".join(lines)


def _after_kill(
    report: checkpoint.RestoreReport, cell: Any, activity: tuple[int | None, float] | None
) -> str:
    """ "restored 12 variables (1.2 GB) as of cell [5] (saved 40 s before the kernel stopped
    without warning; later cells were lost)"."""
    size = checkpoint._size(int(report.checkpoint.manifest.get("bytes", 0)))
    which = f"cell [{cell}]" if isinstance(cell, int) else "its last saved cell"
    text = f"restored {checkpoint._count(len(report.restored))} ({size}) as of {which}"
    created = report.checkpoint.created
    if activity is not None and activity[1] > created:
        before = checkpoint._age(activity[1] - created)
        text += (
            f" (saved {before} before the kernel stopped without warning; later cells were lost)"
        )
    else:
        text += (
            f" (saved {checkpoint._age(report.age_seconds)} ago, after the last cell the kernel "
            "finished; the kernel then stopped without warning)"
        )
    if report.skipped:
        text += "; not restored: " + ", ".join(f"{n} ({t})" for n, t, _ in report.skipped)
    return text
