"""Save a kernel's variables into a checkpoint directory and restore them after re-admission.

The public API: records, protocols, errors and `summary` are defined here; `snapshot` decides
*what* is written (`save`, `restore`), `payloads` how big arrays and tensors go out of band,
`stores` *where* and how a checkpoint commits. Runs inside the kernel process (stdlib, dill,
numpy, torch if present): never import server-side code here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from kernel_queue.errors import KernelQueueError

FORMAT_VERSION = 1
"""The `format` field of every manifest this code writes; `restore` refuses any other."""


class CheckpointError(KernelQueueError, RuntimeError):
    """A checkpoint could not be written or read."""


class FormatMismatch(CheckpointError, ValueError):
    """The checkpoint was written in a format this version of kernel-queue cannot read."""


@dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint: its `manifest.json` is durable, so it can be restored."""

    id: str
    """Sortable in creation order (zero-padded counter, then a timestamp)."""
    path: Path
    """The checkpoint's directory (payload files and `manifest.json`)."""
    created: float
    """Epoch seconds, from the manifest."""
    manifest: Mapping[str, Any] = field(compare=False, repr=False)
    """The parsed `manifest.json` (not compared: two records of one checkpoint are equal)."""


class CheckpointWriter(Protocol):
    """One checkpoint being written; from `CheckpointStore.begin()`."""

    def open(self, name: str) -> BinaryIO:
        """A new payload file in the checkpoint (binary, write); flushed and fsynced on close."""
        ...

    def commit(self, manifest: Mapping[str, Any]) -> Checkpoint:
        """Write `manifest.json` last (tmp, fsync, rename, directory fsync); it now counts."""
        ...

    def abort(self) -> None:
        """Drop the uncommitted checkpoint; the previous ones stay untouched."""
        ...


class CheckpointStore(Protocol):
    """Where one kernel's checkpoints live."""

    def begin(self) -> CheckpointWriter:
        """Start a new checkpoint (and clean up what an earlier crash left uncommitted)."""
        ...

    def latest(self) -> Checkpoint | None:
        """The newest committed checkpoint not marked restored, or None."""
        ...

    def committed(self) -> list[Checkpoint]:
        """Every committed checkpoint with a readable manifest, oldest first (restored ones too)."""
        ...

    def mark_restored(self, checkpoint: Checkpoint) -> None:
        """Mark `checkpoint` restored so a later plain relaunch does not restore it again."""
        ...

    def delete_all(self) -> None:
        """Remove the kernel's checkpoints and the store's directory."""
        ...


@dataclass(frozen=True)
class SaveReport:
    """What `save` did; `summary()` turns it into the sentence users read."""

    checkpoint: Checkpoint | None
    """None when nothing was committed (deadline passed, error)."""
    saved: tuple[tuple[str, int], ...]
    """(name, approximate bytes) per saved variable."""
    skipped: tuple[tuple[str, str, str], ...]
    """(name, type name, reason) per variable that could not be saved."""
    bytes: int
    """Bytes written (payload files and manifest)."""
    seconds: float
    consistency: str
    """"consistent" (saved at a cell boundary) or "concurrent" (saved while code ran)."""
    error: str = ""
    """Why nothing was committed ("deadline", or the exception), if so."""


@dataclass(frozen=True)
class RestoreReport:
    """What `restore` did; `summary()` turns it into the sentence users read."""

    checkpoint: Checkpoint
    restored: tuple[tuple[str, int], ...]
    """(name, approximate bytes) per restored variable."""
    skipped: tuple[tuple[str, str, str], ...]
    """(name, type name, reason) recorded at save time, then names imported by reference that
    no longer import (type "reference" or "module")."""
    age_seconds: float
    """How old the checkpoint was when restored."""
    consistency: str


def summary(report: SaveReport | RestoreReport) -> str:
    """The sentence users read about a save or a restore."""
    if isinstance(report, RestoreReport):
        total = int(report.checkpoint.manifest.get("bytes", 0))
        text = (
            f"restored {_count(len(report.restored))} ({_size(total)}) from a checkpoint "
            f"{_age(report.age_seconds)} old"
        )
        if report.skipped:
            text += "; not restored: " + ", ".join(f"{n} ({t})" for n, t, _ in report.skipped)
        if report.consistency == "concurrent":
            text += "; it was saved while code was running, so some values may be mid-update"
        return text
    if report.checkpoint is None:
        why = "the deadline passed" if report.error == "deadline" else report.error
        text = f"checkpoint not saved after {report.seconds:.1f} s ({why}); any earlier one is kept"
    else:
        text = f"saved {_count(len(report.saved))} ({_size(report.bytes)})"
        text += f" in {report.seconds:.1f} s"
    if report.skipped:
        text += "; not saved: " + ", ".join(f"{n} ({t}: {r})" for n, t, r in report.skipped)
    return text


def _count(n: int) -> str:
    return f"{n} variable" if n == 1 else f"{n} variables"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _age(seconds: float) -> str:
    for unit, scale, least in (("days", 86400, 172800), ("h", 3600, 3600), ("min", 60, 60)):
        if seconds >= least:
            return f"{seconds / scale:.0f} {unit}"
    return f"{seconds:.0f} s"


# The implementations use the records above, so they are imported last.
from kernel_queue.checkpoint.snapshot import restore, save  # noqa: E402
from kernel_queue.checkpoint.stores import DirectoryStore  # noqa: E402

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "CheckpointWriter",
    "DirectoryStore",
    "FormatMismatch",
    "RestoreReport",
    "SaveReport",
    "restore",
    "save",
    "summary",
]
