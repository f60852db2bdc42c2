"""Save a kernel's variables into a checkpoint directory and restore them after re-admission.

The public API: records, protocols, errors and `summary` are defined here; `snapshot` decides
*what* is written (`save`, `restore`), `payloads` how big arrays and tensors go out of band,
`stores` *where* and how a checkpoint commits, `digests` and `signatures` how it is checked, and
`recovery` which checkpoint a new kernel restores (`recover`). Runs inside the kernel process
(stdlib, dill, numpy, torch if present): never import server-side code here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from kernel_queue.errors import KernelQueueError

FORMAT_VERSION = 2
"""The `format` field of every manifest this code writes; `restore` refuses any other.
2: payload digests, the manifest's checksum and signature (1 had payload sizes only)."""


class CheckpointError(KernelQueueError, RuntimeError):
    """A checkpoint could not be written or read."""


class FormatMismatch(CheckpointError, ValueError):
    """The checkpoint was written in a format this version of kernel-queue cannot read."""


class CheckpointDamaged(CheckpointError):
    """A payload file does not match the size or digest its manifest recorded; nothing of the
    checkpoint was loaded."""


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


@dataclass(frozen=True)
class Candidate:
    """A directory in a store named like a checkpoint, as `CheckpointStore.candidates` found it."""

    id: str
    path: Path
    created: float
    """Epoch seconds: the manifest's, else the time in the id."""
    checkpoint: Checkpoint | None
    """The checkpoint, if its manifest and files are whole and it is this store's own."""
    kind: str = ""
    """Why not: "damaged", "foreign" (not signed by this kernel) or "format" (another format)."""
    reason: str = ""
    """A clause saying why not ("its manifest is empty")."""
    restored: bool = False
    """It carries the `restored` marker."""
    manifest: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """The parsed manifest whenever it parsed, even if the checkpoint is unusable."""


class CheckpointWriter(Protocol):
    """One checkpoint being written; from `CheckpointStore.begin()`."""

    def open(self, name: str) -> BinaryIO:
        """A new payload file in the checkpoint (binary, write); durable before `commit` returns."""
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

    def candidates(self) -> list[Candidate]:
        """Every directory named like a checkpoint, newest first, usable or not (and why not)."""
        ...

    def set_aside(self, candidate: Candidate) -> Path:
        """Rename an unusable checkpoint out of the readers' way (never delete it); its new path."""
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
    reused: int = 0
    """Of `bytes`, those linked from the base checkpoint rather than written (incremental)."""
    digests: Mapping[int, tuple[int, str]] = field(default_factory=dict, compare=False, repr=False)
    """id -> (bytes, digest) of each array saved to its own file (`save`'s `known`)."""
    places: Mapping[tuple[Any, ...], tuple[int, str]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """The same by `payloads.place` of each contiguous array (a later save's `history`)."""


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


@dataclass(frozen=True)
class Problem:
    """A checkpoint `recover` could not restore: what was wrong and where it is now."""

    id: str
    kind: str
    """"damaged", "foreign", "format" or "failed" (its values did not load here)."""
    reason: str
    created: float
    moved_to: Path | None = None
    """Where it was set aside, or None if it was left in place."""


@dataclass(frozen=True)
class Recovery:
    """What `recover` did with a store's checkpoints; `summary()` makes the sentences."""

    report: RestoreReport | None
    """What was restored, or None (nothing restorable, or the newest was restored already)."""
    problems: tuple[Problem, ...] = ()
    """Newer checkpoints that could not be restored, newest first."""
    lacks: tuple[str, ...] | None = ()
    """Names the newest unusable checkpoint of ours saved that the restored one lacks; None if
    that manifest could not be read."""


def summary(report: SaveReport | RestoreReport | Recovery) -> str:
    """The sentence users read about a save, a restore or a recovery."""
    if isinstance(report, Recovery):
        return recovery.describe(report)
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
        if report.reused:
            text = text[:-1] + f", {_size(report.bytes - report.reused)} of it changed)"
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


LAZY = ("restore", "save")
"""`snapshot`'s functions, imported at their first use (`__getattr__`, `load`): the serializer
(dill) and the payload writers cost a kernel about 20 ms at start, which one with nothing to
restore need not wait for."""
NEEDS = ("dill",)
"""What `load` imports beyond the standard library (numpy and torch only where values are
theirs): `missing` tells a kernel at start, without importing it."""


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(load(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load() -> ModuleType:
    """Import what saving and restoring need, once: at the first save or restore, or a second
    after a kernel that restored nothing started (so a SIGTERM's save does not spend its grace
    on it: `launcher.kernel.LOAD_DELAY`)."""
    from kernel_queue.checkpoint import snapshot

    return snapshot


def missing() -> str | None:
    """The first of `NEEDS` this environment cannot import, else None."""
    return next((name for name in NEEDS if importlib.util.find_spec(name) is None), None)


# The implementations use the records above, so they are imported last.
from kernel_queue.checkpoint import recovery  # noqa: E402
from kernel_queue.checkpoint.recovery import recover  # noqa: E402
from kernel_queue.checkpoint.signatures import derive as derive_secret  # noqa: E402
from kernel_queue.checkpoint.stores import DirectoryStore  # noqa: E402

if TYPE_CHECKING:
    from kernel_queue.checkpoint.snapshot import restore, save

__all__ = [
    "FORMAT_VERSION",
    "Candidate",
    "Checkpoint",
    "CheckpointDamaged",
    "CheckpointError",
    "CheckpointStore",
    "CheckpointWriter",
    "DirectoryStore",
    "FormatMismatch",
    "Problem",
    "Recovery",
    "RestoreReport",
    "SaveReport",
    "derive_secret",
    "load",
    "missing",
    "recover",
    "restore",
    "save",
    "summary",
]
