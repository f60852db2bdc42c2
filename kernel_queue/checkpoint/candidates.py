"""What a directory named like a checkpoint id holds: a usable checkpoint, or what is wrong.

A checkpoint directory is `<root>/<id>/`: payload files and `manifest.json` (`MANIFEST`), and
once restored a `restored` marker (`RESTORED`). `examine` reads the manifest and checks its
checksum, format, signature and the size of every file it lists (the digests are checked as the
files are read); a directory that fails is a `Candidate` without a checkpoint, saying why.
Reads only; the store decides what to do with what it finds.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernel_queue.checkpoint import FORMAT_VERSION, Candidate, Checkpoint, digests, signatures

MANIFEST = "manifest.json"
RESTORED = "restored"
"""Marker file: the checkpoint was restored once; a plain relaunch must not restore it again."""
RESERVED = frozenset({MANIFEST, RESTORED})
"""Names in a checkpoint directory that are no payload file."""
ID = re.compile(r"^(\d{8,})-(\d{8}T\d{6})(\d{3})Z$")
"""A checkpoint id: a zero-padded sequence number, then the UTC time of its start."""
SEQ = re.compile(r"^(\d{8,})-")


def examine(path: Path, secret: bytes | None) -> Candidate:
    """What `path` (named like a checkpoint id) is: a usable checkpoint, or why not."""
    ident, restored = path.name, (path / RESTORED).exists()

    def unusable(kind: str, reason: str, manifest: Any = None) -> Candidate:
        created = _created(path, manifest)
        known = manifest if isinstance(manifest, dict) else None
        return Candidate(ident, path, created, None, kind, reason, restored, known)

    try:
        data = (path / MANIFEST).read_bytes()
    except FileNotFoundError:
        return unusable("damaged", "it has no manifest.json")
    except OSError as exc:
        return unusable("damaged", f"its manifest cannot be read ({exc.strerror or exc})")
    if not data.strip():
        return unusable("damaged", "its manifest is empty")
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        return unusable("damaged", "its manifest is not valid JSON (cut short?)")
    if not isinstance(manifest, dict):
        return unusable("damaged", "its manifest is not a JSON object")
    version = manifest.get("format", FORMAT_VERSION)
    if version != FORMAT_VERSION and isinstance(version, int) and not isinstance(version, bool):
        reason = (
            f"it was written in checkpoint format {version}, but this kernel-queue reads "
            f"format {FORMAT_VERSION} only; restore it with the kernel-queue version that wrote "
            "it, or start afresh"
        )
        return unusable("format", reason, manifest)
    damage = signatures.damage(manifest)
    if damage:
        return unusable("damaged", damage, manifest)
    if secret is not None:
        foreign = signatures.foreign(manifest, secret)
        if foreign:
            return unusable("foreign", foreign, manifest)
    damage = _file_damage(path, manifest)
    if damage:
        return unusable("damaged", damage, manifest)
    created = _created(path, manifest)
    checkpoint = Checkpoint(id=ident, path=path, created=created, manifest=manifest)
    return Candidate(ident, path, created, checkpoint, restored=restored, manifest=manifest)


def _file_damage(path: Path, manifest: Mapping[str, Any]) -> str:
    """Why the files the manifest lists are not all there at their sizes ("" if they are)."""
    files = manifest.get("files")
    if manifest.get("digest") != digests.ALGORITHM or not isinstance(files, dict):
        return "its manifest lists no files with digests this kernel-queue checks"
    for name, entry in sorted(files.items()):
        size = entry.get("bytes") if isinstance(entry, dict) else None
        if not plain_name(name) or not isinstance(size, int) or name in RESERVED:
            return f"its manifest lists a bad file entry {name!r}"
        if not isinstance(entry.get("digest"), str):
            return f"its manifest has no digest for {name}"
        try:
            actual = (path / name).stat().st_size
        except FileNotFoundError:
            return f"its file {name} is missing"
        except OSError as exc:
            return f"its file {name} cannot be read ({exc.strerror or exc})"
        if actual != size:
            return f"its file {name} is {actual} bytes, the manifest says {size}"
    return ""


def _created(path: Path, manifest: Any) -> float:
    """The manifest's `created`, else the time in the id, else the directory's mtime."""
    created = manifest.get("created") if isinstance(manifest, dict) else None
    if isinstance(created, int | float) and not isinstance(created, bool):
        return float(created)
    match = ID.match(path.name)
    if match:
        with contextlib.suppress(ValueError):
            stamp = time.strptime(match.group(2), "%Y%m%dT%H%M%S")
            return calendar.timegm(stamp) + int(match.group(3)) / 1000
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def seq(name: str) -> int:
    """The sequence number a directory name starts with (0 for a name that starts otherwise)."""
    match = SEQ.match(name)
    return int(match.group(1)) if match else 0


def plain_name(name: str) -> bool:
    """Whether `name` can be a payload file's: one path segment, not hidden."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")
