"""Where checkpoints live: `DirectoryStore`, a kernel's checkpoints in a local or mounted directory.

A checkpoint is `<root>/<id>/` holding payload files and `manifest.json`, the commit marker
written last (file fsync, rename, directory fsync). It is written as `<id>.partial` and renamed
into place, so readers never see a checkpoint in progress; a kill at any moment leaves the
previous committed checkpoint intact. The manifest records each file's size and digest and is
sealed (`signatures`); a damaged or foreign checkpoint is renamed aside, never deleted. An
incremental checkpoint hard-links the unchanged payload files of an older one (`link`), so each
directory stays whole and retiring one frees only what no newer one shares: the kept
checkpoints use at most the newest's bytes plus each older one's increment. How the
files are made durable is `durable`'s, what a directory holds `candidates`'. Knows nothing about
what the payload files contain.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from kernel_queue.checkpoint import (
    Candidate,
    Checkpoint,
    CheckpointError,
    candidates,
    digests,
    durable,
    signatures,
)
from kernel_queue.checkpoint.candidates import MANIFEST, RESTORED

__all__ = ["MANIFEST", "RESTORED", "DirectoryStore", "DirectoryWriter"]

PARTIAL, DELETING = ".partial", durable.DELETING
ASIDE = {"damaged": ".damaged", "foreign": ".foreign"}
"""The suffix a checkpoint set aside gets, by what was wrong with it."""
_STORE_FIELDS = {"files", "digest", signatures.CHECKSUM, signatures.SIGNATURE}


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
            durable.make_private(self.root)
            self._clean_leftovers()
            seq = max((candidates.seq(p.name) for p in self.root.iterdir()), default=0) + 1
            while True:
                now = time.time()
                stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
                ident = f"{seq:08d}-{stamp}{int(now * 1000) % 1000:03d}Z"
                path = self.root / (ident + PARTIAL)
                try:
                    path.mkdir(mode=durable.DIR_MODE)
                except FileExistsError:
                    seq += 1
                    continue
                os.chmod(path, durable.DIR_MODE)
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
            paths = [p for p in self.root.iterdir() if candidates.ID.match(p.name) and p.is_dir()]
        except FileNotFoundError:
            return []
        paths.sort(key=lambda p: (int(candidates.ID.match(p.name).group(1)), p.name), reverse=True)  # type: ignore[union-attr]
        return [candidates.examine(path, self.secret) for path in paths]

    def mark_restored(self, checkpoint: Checkpoint) -> None:
        """Write the `restored` marker (atomically, durably) into `checkpoint`'s directory."""
        record = json.dumps({"restored": time.time()}).encode()
        durable.write_atomic(checkpoint.path / RESTORED, record)

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
                    durable.fsync_dir(self.root)
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
                durable.remove(checkpoint.path)

    def _clean_leftovers(self) -> None:
        for path in self.root.iterdir():
            if not candidates.SEQ.match(path.name):
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
        self._files: dict[str, durable.SyncedFile] = {}
        self._linked: dict[str, dict[str, Any]] = {}  # name -> the reused file's bytes, digest
        self._done = False

    def open(self, name: str) -> BinaryIO:
        """Create payload file `name` (0600); closing it starts its fsync, `commit` awaits it."""
        self._check_open()
        if name in self._files or name in candidates.RESERVED or not candidates.plain_name(name):
            raise ValueError(f"cannot create payload file {name!r} in checkpoint {self.id}")
        # read access too: big writes are hashed from the page cache (`durable.SyncedFile.write`)
        fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, durable.FILE_MODE)
        os.fchmod(fd, durable.FILE_MODE)
        file = durable.SyncedFile(io.FileIO(fd, "wb"), buffer_size=1 << 20)
        file.digest = digests.Digest()
        file.sync_fd = os.dup(fd)
        self._files[name] = file
        return file

    def link(self, name: str, source: Path, size: int, digest: str) -> bool:
        """Reuse `source`, a payload file of a committed checkpoint of this store whose manifest
        recorded `size` and `digest`, as payload file `name`: a hard link (the same inode: no
        byte is written), else a copy (fsynced). False, nothing done, when `source` is not
        `size` bytes any more or cannot be read: the caller writes the file itself.

        Committed files are never written again, so sharing one is safe; each checkpoint
        directory still lists and holds all its files, so deleting an old one frees only what
        no newer checkpoint shares. Damage to a shared file is damage to every checkpoint that
        holds it, and is found by its digest when one is restored (`digests.read_into`).
        """
        self._check_open()
        if name in self._files or name in self._linked or not candidates.plain_name(name):
            raise ValueError(f"cannot create payload file {name!r} in checkpoint {self.id}")
        target = self.path / name
        try:
            if os.stat(source).st_size != size:
                return False
            try:
                os.link(source, target)
            except OSError:  # no hard links here (another filesystem, a FUSE mount): copy
                shutil.copyfile(source, target)
                os.chmod(target, durable.FILE_MODE)
                fd = os.open(target, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                target.unlink()
            return False
        self._linked[name] = {"bytes": size, "digest": digest}
        return True

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
        files.update(self._linked)  # their directory entries are fsynced with the manifest's
        record = {**manifest, "files": files, "digest": digests.ALGORITHM}
        try:
            # sealed as it will read back (tuples as lists, keys as strings)
            plain = json.loads(json.dumps(record, sort_keys=True, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the manifest is not plain JSON: {exc}") from exc
        sealed = signatures.seal(plain, self._store.secret)
        data = json.dumps(sealed, indent=1, sort_keys=True).encode()
        durable.write_atomic(self.path / MANIFEST, data)
        final = self._store.root / self.id
        os.rename(self.path, final)
        durable.fsync_dir(self._store.root)
        self._done = True
        self._store._active.discard(self.path.name)
        checkpoint = candidates.examine(final, self._store.secret).checkpoint
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
                durable.syncers().submit(os.close, file.sync_fd)
        shutil.rmtree(self.path, ignore_errors=True)
        self._store._active.discard(self.path.name)

    def _check_open(self) -> None:
        if self._done:
            raise CheckpointError(f"checkpoint {self.id} is already committed or aborted")
