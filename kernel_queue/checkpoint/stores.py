"""Where checkpoints live: `DirectoryStore`, a kernel's checkpoints in a local or mounted directory.

A checkpoint is `<root>/<id>/` holding payload files and `manifest.json`, the commit marker
written last (file fsync, rename, directory fsync). It is written as `<id>.partial` and renamed
into place, so readers never see a checkpoint in progress; a kill at any moment leaves the
previous committed checkpoint intact. The manifest records each file's size and digest and is
sealed (`signatures`); a damaged or foreign checkpoint is renamed aside, never deleted. Knows
nothing about what the payload files contain.
"""

from __future__ import annotations

import calendar
import contextlib
import io
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from kernel_queue.checkpoint import (
    FORMAT_VERSION,
    Candidate,
    Checkpoint,
    CheckpointError,
    digests,
    signatures,
)

MANIFEST = "manifest.json"
RESTORED = "restored"
"""Marker file: the checkpoint was restored once; a plain relaunch must not restore it again."""
PARTIAL, DELETING = ".partial", ".deleting"
ASIDE = {"damaged": ".damaged", "foreign": ".foreign"}
"""The suffix a checkpoint set aside gets, by what was wrong with it."""
_ID = re.compile(r"^(\d{8,})-(\d{8}T\d{6})(\d{3})Z$")
_SEQ = re.compile(r"^(\d{8,})-")
_RESERVED = {MANIFEST, RESTORED}
_STORE_FIELDS = {"files", "digest", signatures.CHECKSUM, signatures.SIGNATURE}
_DIR_MODE, _FILE_MODE = 0o700, 0o600
_SYNCERS_LOCK = threading.Lock()


class DirectoryStore:
    """The checkpoints of one kernel under `root` (e.g. `<checkpoint path>/<kernel id>`).

    `keep` committed checkpoints are retained; older ones are deleted only after a newer
    manifest is durable. Directories the store creates (the root and any missing parent) are
    0700 and files 0600 whatever the umask. With a `secret` (`signatures.derive`) every manifest
    is signed and only checkpoints signed with it count; without one, manifests carry a checksum
    only and any signature is taken on trust (for tools that read a kernel's store).
    """

    def __init__(self, root: Path | str, *, keep: int = 2, secret: bytes | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.root = Path(root)
        self.keep = keep
        self.secret = secret
        self._lock = threading.Lock()
        self._active: set[str] = set()  # partial directories this store is still writing

    def begin(self) -> DirectoryWriter:
        """Start a checkpoint in `<root>/<id>.partial/`, after removing leftovers of a crash.

        Its number follows every name in the root that starts like an id (foreign, damaged or
        set aside too), so it sorts after all of them and reuses none.
        """
        with self._lock:
            _make_private(self.root)
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
        """The newest usable checkpoint, or None if there is none or it was restored already.

        An older checkpoint is never returned in place of a restored newer one: restoring it
        would roll the kernel back behind state the user already had.
        """
        for candidate in self.candidates():
            if candidate.checkpoint is not None:
                return None if candidate.restored else candidate.checkpoint
        return None

    def committed(self) -> list[Checkpoint]:
        """Usable checkpoints, oldest first; skips damaged and foreign ones."""
        found = reversed(self.candidates())
        return [c.checkpoint for c in found if c.checkpoint is not None]

    def candidates(self) -> list[Candidate]:
        """Every directory named like a checkpoint id, newest first, with what is wrong with it.

        Checks each manifest (parse, checksum, format, signature) and each file's size; the
        payload digests are checked as the files are read (`digests.read_into`).
        """
        try:
            paths = [p for p in self.root.iterdir() if _ID.match(p.name) and p.is_dir()]
        except FileNotFoundError:
            return []
        paths.sort(key=lambda p: (int(_ID.match(p.name).group(1)), p.name), reverse=True)  # type: ignore[union-attr]
        return [_examine(path, self.secret) for path in paths]

    def mark_restored(self, checkpoint: Checkpoint) -> None:
        """Write the `restored` marker (atomically, durably) into `checkpoint`'s directory."""
        record = json.dumps({"restored": time.time()}).encode()
        _write_atomic(checkpoint.path / RESTORED, record)

    def set_aside(self, candidate: Candidate) -> Path:
        """Rename a damaged or foreign checkpoint to `<id>.damaged` / `<id>.foreign` (then
        `.damaged-2`, …) and fsync the root; nothing in it is deleted or changed."""
        suffix = ASIDE.get(candidate.kind, ".damaged")
        with self._lock:
            for attempt in range(1, 1000):
                target = candidate.path.with_name(
                    candidate.path.name + suffix + (f"-{attempt}" if attempt > 1 else "")
                )
                if not target.exists():
                    os.rename(candidate.path, target)
                    _fsync_dir(self.root)
                    return target
        raise CheckpointError(f"no free name to set checkpoint {candidate.id} aside")

    def delete_all(self) -> None:
        """Remove every checkpoint of this kernel and the root directory itself."""
        with self._lock:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.root.exists():
                raise CheckpointError(f"could not delete the checkpoint directory {self.root}")

    def _retire(self) -> None:
        """Delete this store's usable checkpoints older than the `keep` newest; a damaged or
        foreign directory is never deleted (a restore sets it aside)."""
        with self._lock:
            usable = self.committed()
            for checkpoint in usable[: -self.keep]:
                _remove(checkpoint.path)

    def _clean_leftovers(self) -> None:
        for path in self.root.iterdir():
            if not _SEQ.match(path.name):
                continue  # not a name this store writes: leave it alone
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
        """Create payload file `name` (0600); closing it starts its fsync, `commit` awaits it."""
        self._check_open()
        if name in self._files or name in _RESERVED or not _plain_name(name):
            raise ValueError(f"cannot create payload file {name!r} in checkpoint {self.id}")
        # read access too: big writes are hashed from the page cache (`_SyncedFile.write`)
        fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        os.fchmod(fd, _FILE_MODE)
        file = _SyncedFile(io.FileIO(fd, "wb"), buffer_size=1 << 20)
        file.digest = digests.Digest()
        file.sync_fd = os.dup(fd)
        self._files[name] = file
        return file

    def commit(self, manifest: Mapping[str, Any]) -> Checkpoint:
        """Write `manifest.json` (with `files`: name → bytes and digest) last; it now counts.

        The manifest is sealed with a checksum and, if the store has a secret, signed. Order:
        payload files are already fsynced; manifest tmp file, fsync, rename, fsync of the
        checkpoint directory; rename `<id>.partial` → `<id>`, fsync of the root. Then older
        checkpoints beyond `keep` are deleted.
        """
        self._check_open()
        still_open = sorted(name for name, file in self._files.items() if not file.closed)
        if still_open:
            raise CheckpointError(f"payload files still open at commit: {', '.join(still_open)}")
        clash = sorted(_STORE_FIELDS.intersection(manifest))
        if clash:
            raise ValueError(f"the manifest fields {clash} are written by the store")
        for file in self._files.values():
            file.durable()
        files = {name: {"bytes": f.size, "digest": f.hexdigest} for name, f in self._files.items()}
        record = {**manifest, "files": files, "digest": digests.ALGORITHM}
        try:
            # sealed as it will read back (tuples as lists, keys as strings)
            plain = json.loads(json.dumps(record, sort_keys=True, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the manifest is not plain JSON: {exc}") from exc
        sealed = signatures.seal(plain, self._store.secret)
        data = json.dumps(sealed, indent=1, sort_keys=True).encode()
        _write_atomic(self.path / MANIFEST, data)
        final = self._store.root / self.id
        os.rename(self.path, final)
        _fsync_dir(self._store.root)
        self._done = True
        self._store._active.discard(self.path.name)
        checkpoint = _examine(final, self._store.secret).checkpoint
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
            if not file.closed:
                with contextlib.suppress(OSError, ValueError):
                    io.BufferedWriter.close(file)  # no fsync: the files are being thrown away
                _syncers().submit(os.close, file.sync_fd)
        shutil.rmtree(self.path, ignore_errors=True)
        self._store._active.discard(self.path.name)

    def _check_open(self) -> None:
        if self._done:
            raise CheckpointError(f"checkpoint {self.id} is already committed or aborted")


class _SyncedFile(io.BufferedWriter):
    """A payload file: every write is hashed; `close()` flushes, records the size and digest,
    and starts the fsync that the commit waits for.

    A big write is hashed from the file itself once written (the page cache, mapped), by the
    digest threads while the caller goes on: the digest is of the bytes the file holds even if
    another thread changes the caller's buffer (a cell still running), and costs no copy.
    """

    size = 0
    hexdigest = ""
    digest: digests.Digest

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes < digests.PARALLEL:
            self.digest.update(view)
            return super().write(view)
        self.flush()
        start = self.tell()  # exact: nothing is buffered after the flush
        written = super().write(view)
        self.flush()
        self.digest.update_from_file(self.fileno(), start, written)
        return written

    sync_fd = -1
    """A second descriptor of the file for the `_SYNCERS` thread, which closes it."""
    synced: Future[None] | None = None
    """The file's fsync, run by the `_SYNCERS` thread while the next file is written; the
    commit waits for it (`durable`)."""

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
            self.size = self.tell()
            self.hexdigest = self.digest.hexdigest()
        finally:
            super().close()
        self.synced = _syncers().submit(_fsync_and_close, self.sync_fd)

    def durable(self) -> None:
        """Wait for the fsync `close` started; raise what it raised."""
        if self.synced is not None:
            self.synced.result()


def _examine(path: Path, secret: bytes | None) -> Candidate:
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
        if not _plain_name(name) or not isinstance(size, int) or name in _RESERVED:
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
    match = _ID.match(path.name)
    if match:
        with contextlib.suppress(ValueError):
            stamp = time.strptime(match.group(2), "%Y%m%dT%H%M%S")
            return calendar.timegm(stamp) + int(match.group(3)) / 1000
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _make_private(root: Path) -> None:
    """Create `root` and every missing parent 0700 (whatever the umask); make `root` 0700."""
    missing = []
    for path in root.parents:
        if path.exists():
            break
        missing.append(path)
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=_DIR_MODE)
            os.chmod(path, _DIR_MODE)
    root.mkdir(mode=_DIR_MODE, exist_ok=True)
    os.chmod(root, _DIR_MODE)


_syncers_pool: tuple[int, ThreadPoolExecutor] | None = None


def _syncers() -> ThreadPoolExecutor:
    """The thread that fsyncs closed payload files, in order (new after a fork)."""
    global _syncers_pool
    with _SYNCERS_LOCK:
        if _syncers_pool is None or _syncers_pool[0] != os.getpid():
            _syncers_pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="kq-fsync"))
        return _syncers_pool[1]


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    match = _SEQ.match(name)
    return int(match.group(1)) if match else 0


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")
