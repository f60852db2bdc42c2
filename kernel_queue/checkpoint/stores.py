"""Where checkpoints live: `DirectoryStore`, a kernel's checkpoints in a local or mounted directory.

A checkpoint is `<root>/<id>/` holding payload files and `manifest.json`, the commit marker
written last (file fsync, rename, directory fsync). It is written as `<id>.partial` and renamed
into place, so readers never see a checkpoint in progress; a kill at any moment leaves the
previous committed checkpoint intact. Knows nothing about what the payload files contain.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from kernel_queue.checkpoint import Checkpoint, CheckpointError

MANIFEST = "manifest.json"
RESTORED = "restored"
"""Marker file: the checkpoint was restored once; a plain relaunch must not restore it again."""
PARTIAL, DELETING = ".partial", ".deleting"
_ID = re.compile(r"^(\d{8})-\d{8}T\d{9}Z$")
_RESERVED = {MANIFEST, RESTORED}
_DIR_MODE, _FILE_MODE = 0o700, 0o600


class DirectoryStore:
    """The checkpoints of one kernel under `root` (e.g. `<checkpoint path>/<kernel id>`).

    `keep` committed checkpoints are retained; older ones are deleted only after a newer
    manifest is durable. Directories are created 0700 and files 0600 whatever the umask.
    """

    def __init__(self, root: Path | str, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.root = Path(root)
        self.keep = keep
        self._lock = threading.Lock()
        self._active: set[str] = set()  # partial directories this store is still writing

    def begin(self) -> DirectoryWriter:
        """Start a checkpoint in `<root>/<id>.partial/`, after removing leftovers of a crash."""
        with self._lock:
            self.root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            os.chmod(self.root, _DIR_MODE)
            self._clean_leftovers()
            seq = max((_seq(p.name) for p in self.root.iterdir()), default=0) + 1
            while True:
                now = time.time()
                stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
                ident = f"{seq:08d}-{stamp}{int(now * 1000) % 1000:03d}Z"
                path = self.root / (ident + PARTIAL)
                try:
                    path.mkdir(mode=_DIR_MODE)
                except FileExistsError:
                    seq += 1
                    continue
                os.chmod(path, _DIR_MODE)
                self._active.add(path.name)
                return DirectoryWriter(self, ident, path)

    def latest(self) -> Checkpoint | None:
        """The newest committed checkpoint, or None if there is none or it was restored already.

        An older checkpoint is never returned in place of a restored newer one: restoring it
        would roll the kernel back behind state the user already had.
        """
        committed = self.committed()
        if not committed or (committed[-1].path / RESTORED).exists():
            return None
        return committed[-1]

    def committed(self) -> list[Checkpoint]:
        """Committed checkpoints, oldest first; skips unreadable manifests and missing files."""
        try:
            names = sorted(p.name for p in self.root.iterdir() if _ID.match(p.name))
        except FileNotFoundError:
            return []
        found = (_read(self.root / name) for name in names)
        return [checkpoint for checkpoint in found if checkpoint is not None]

    def mark_restored(self, checkpoint: Checkpoint) -> None:
        """Write the `restored` marker (atomically, durably) into `checkpoint`'s directory."""
        record = json.dumps({"restored": time.time()}).encode()
        _write_atomic(checkpoint.path / RESTORED, record)

    def delete_all(self) -> None:
        """Remove every checkpoint of this kernel and the root directory itself."""
        with self._lock:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.root.exists():
                raise CheckpointError(f"could not delete the checkpoint directory {self.root}")

    def _retire(self) -> None:
        """Delete committed checkpoints (and damaged ones) older than the `keep` newest."""
        with self._lock:
            kept = [c.id for c in self.committed()][-self.keep :]
            if not kept:
                return
            for path in sorted(self.root.iterdir()):
                if _ID.match(path.name) and path.name < kept[0]:
                    _remove(path)

    def _clean_leftovers(self) -> None:
        for path in self.root.iterdir():
            if path.name.endswith(DELETING) or (
                path.name.endswith(PARTIAL) and path.name not in self._active
            ):
                shutil.rmtree(path, ignore_errors=True)


class DirectoryWriter:
    """One checkpoint being written into `<root>/<id>.partial/`; from `DirectoryStore.begin()`."""

    def __init__(self, store: DirectoryStore, ident: str, path: Path) -> None:
        self.id, self.path = ident, path
        self._store = store
        self._files: dict[str, _SyncedFile] = {}
        self._done = False

    def open(self, name: str) -> BinaryIO:
        """Create payload file `name` (0600); it is flushed and fsynced when closed."""
        self._check_open()
        if name in self._files or name in _RESERVED or not _plain_name(name):
            raise ValueError(f"cannot create payload file {name!r} in checkpoint {self.id}")
        fd = os.open(self.path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        os.fchmod(fd, _FILE_MODE)
        file = _SyncedFile(io.FileIO(fd, "wb"), buffer_size=1 << 20)
        self._files[name] = file
        return file

    def commit(self, manifest: Mapping[str, Any]) -> Checkpoint:
        """Write `manifest.json` (with `files`: name → bytes) last and make the checkpoint count.

        Order: payload files are already fsynced; manifest tmp file, fsync, rename, fsync of the
        checkpoint directory; rename `<id>.partial` → `<id>`, fsync of the root. Then older
        checkpoints beyond `keep` are deleted.
        """
        self._check_open()
        still_open = sorted(name for name, file in self._files.items() if not file.closed)
        if still_open:
            raise CheckpointError(f"payload files still open at commit: {', '.join(still_open)}")
        if "files" in manifest:
            raise ValueError("the manifest field 'files' is written by the store")
        record = {**manifest, "files": {name: f.size for name, f in self._files.items()}}
        try:
            data = json.dumps(record, indent=1, sort_keys=True, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the manifest is not plain JSON: {exc}") from exc
        _write_atomic(self.path / MANIFEST, data)
        final = self._store.root / self.id
        os.rename(self.path, final)
        _fsync_dir(self._store.root)
        self._done = True
        self._store._active.discard(self.path.name)
        checkpoint = _read(final)
        if checkpoint is None:
            raise CheckpointError(f"checkpoint {self.id} did not read back after its commit")
        with contextlib.suppress(OSError):  # committed all the same; the next commit retries
            self._store._retire()
        return checkpoint

    def abort(self) -> None:
        """Close the payload files and delete the uncommitted directory; safe to call twice."""
        if self._done:
            return
        self._done = True
        for file in self._files.values():
            with contextlib.suppress(OSError, ValueError):
                io.BufferedWriter.close(file)  # no fsync: the files are being thrown away
        shutil.rmtree(self.path, ignore_errors=True)
        self._store._active.discard(self.path.name)

    def _check_open(self) -> None:
        if self._done:
            raise CheckpointError(f"checkpoint {self.id} is already committed or aborted")


class _SyncedFile(io.BufferedWriter):
    """A payload file: `close()` flushes and fsyncs before closing, and records the size."""

    size = 0

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
            self.size = self.tell()
            os.fsync(self.fileno())
        finally:
            super().close()


def _read(path: Path) -> Checkpoint | None:
    """The committed checkpoint in `path`, or None if its manifest or files are damaged."""
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
        files = manifest["files"]
        for name, size in files.items():
            if not _plain_name(name) or (path / name).stat().st_size != size:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(manifest, dict):
        return None
    created = manifest.get("created")
    if not isinstance(created, int | float):
        created = path.stat().st_mtime
    return Checkpoint(id=path.name, path=path, created=float(created), manifest=manifest)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `path` via `<path>.tmp`: write, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
    try:
        os.fchmod(fd, _FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _remove(path: Path) -> None:
    """Delete a checkpoint: first rename it out of the readers' sight (durably), then delete."""
    doomed = path.with_name(path.name + DELETING)
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    _fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seq(name: str) -> int:
    match = _ID.match(name.removesuffix(PARTIAL).removesuffix(DELETING))
    return int(match.group(1)) if match else 0


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")
