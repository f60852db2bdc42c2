"""Payload digests: every byte of a checkpoint file is hashed as it is written and checked as it
is read, before anything in it is unpickled or used.

A file's digest is the hash of the concatenated hashes of its 16 MiB pieces, so the pieces of
a big file hash on several cores at once while the next bytes are written or read (the hashers
release the GIL); bytes just written are hashed from the file itself. The hash is BLAKE3 where
the `blake3` package is installed (three times sha256's speed per core, so digests cost a save
little), else sha256; each digest names its hash ("blake3:…"). Knows nothing about what the files
contain.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

_blake3: Any
try:
    import blake3 as _blake3
except ImportError:  # the `checkpoint` extra brings it; sha256 is the fallback
    _blake3 = None

ALGORITHM = "tree-16MiB"
"""The manifest's name for this digest scheme: a hash over the hashes of each 16 MiB piece,
written as "<hash>:<hex>" per file."""
HASHES: dict[str, Any] = {"sha256": hashlib.sha256}
if _blake3 is not None:
    HASHES["blake3"] = _blake3.blake3
PREFERRED = "blake3" if "blake3" in HASHES else "sha256"
"""The hash new digests use."""
PIECE = 16 << 20
PARALLEL = 4 << 20  # smaller writes and reads hash inline: a thread hand-off costs more
STEP = 1 << 20  # read and hash a piece this much at a time, while it is in the core's cache
WORKERS = max(2, min(4, os.cpu_count() or 2))

_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


class Mismatch(Exception):
    """A file's bytes do not match the size or digest the manifest recorded for them."""


class Digest:
    """The running digest of one file, fed its bytes in order by `update`."""

    def __init__(self, hash_name: str = PREFERRED) -> None:
        self.size = 0
        self._hash_name, self._new = hash_name, HASHES[hash_name]
        self._closed: list[Any] = []  # the hashers of the full pieces, in order
        self._piece = self._new()
        self._filled = 0
        self._pending: list[Future[None]] = []
        self._mapped: list[Any] = []  # what the pending hashes read; dropped once they end

    def update(self, data: Any) -> None:
        """Hash `data` (bytes-like), the file's next bytes.

        A big `data` is hashed by the pool's threads, still running when this returns: it must
        not change until the next `update` or `hexdigest` returns (which wait for it). Bytes
        written from a buffer someone else may change go through `update_from_file` instead.
        """
        self._wait()
        view = memoryview(data).cast("B")
        jobs = []
        start = 0
        while start < len(view):
            part = view[start : start + PIECE - self._filled]
            jobs.append((self._piece, part))
            self._filled += len(part)
            start += len(part)
            if self._filled == PIECE:
                self._closed.append(self._piece)
                self._piece, self._filled = self._new(), 0
        self.size += len(view)
        if len(view) < PARALLEL:
            for hasher, part in jobs:
                hasher.update(part)
        else:
            self._pending = [pool().submit(_hash, hasher, part) for hasher, part in jobs]

    def update_from_file(self, fd: int, start: int, length: int) -> None:
        """Hash bytes [start, start + length) of the file `fd` (open for reading) as the page
        cache holds them: bytes just written are hashed as the file has them, whatever happens
        to the buffer they came from. The hash runs on after this returns, like `update`'s."""
        if length <= 0:
            return
        base = start - start % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(fd, start + length - base, prot=mmap.PROT_READ, offset=base)
        self.update(memoryview(mapping)[start - base :])
        self._mapped.append(mapping)

    def hexdigest(self) -> str:
        self._wait()
        tops = [hasher.digest() for hasher in self._closed]
        if self._filled:
            tops.append(self._piece.digest())
        return f"{self._hash_name}:{self._new(b''.join(tops)).hexdigest()}"

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        try:
            for future in pending:
                future.result()
        finally:
            self._mapped.clear()  # unmapped as the last view of each goes


def of_bytes(data: Any) -> str:
    """The digest of `data` as a whole file."""
    digest = Digest()
    digest.update(data)
    return digest.hexdigest()


def read_into(path: Path, buffers: Sequence[Any], size: int, expected: str) -> None:
    """Fill `buffers` (writable, `size` bytes in all, in order) with the file at `path` and check
    its digest; Mismatch if the file is not exactly `size` bytes with digest `expected`.

    The 16 MiB pieces are read (`preadv`) and hashed by the pool's threads, each its own piece.
    """
    hash_name, _, _ = expected.partition(":")
    new = HASHES.get(hash_name)
    if new is None:
        raise Mismatch(
            f"its file {path.name} has a {hash_name!r} digest, which this kernel cannot check "
            "(install kernel-queue[checkpoint], which brings blake3)"
        )
    views = [memoryview(buffer).cast("B") for buffer in buffers]
    if sum(len(view) for view in views) != size:
        raise ValueError(f"buffers of {sum(len(v) for v in views)} bytes for a {size}-byte file")
    fd = os.open(path, os.O_RDONLY)
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise Mismatch(f"its file {path.name} is {actual} bytes, the manifest says {size}")
        pieces = [
            _segments(views, start, min(size, start + PIECE)) for start in range(0, size, PIECE)
        ]
        starts = range(0, size, PIECE)
        if size < PARALLEL or len(pieces) == 1:
            tops = [
                _read_piece(new, fd, start, piece)
                for start, piece in zip(starts, pieces, strict=True)
            ]
        else:
            futures: list[Future[bytes]] = [
                pool().submit(_read_piece, new, fd, start, piece)
                for start, piece in zip(starts, pieces, strict=True)
            ]
            tops = [future.result() for future in futures]
    finally:
        os.close(fd)
    if f"{hash_name}:{new(b''.join(tops)).hexdigest()}" != expected:
        raise Mismatch(f"its file {path.name} does not match its digest (changed after the save)")


def read(path: Path, size: int, expected: str) -> bytearray:
    """The whole file at `path`, once its size and digest are checked (else Mismatch)."""
    data = bytearray(size)
    read_into(path, [data], size, expected)
    return data


def pool() -> ThreadPoolExecutor:
    """The hashing threads, shared by every file of this process (new after a fork)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():  # a forked child has no pool threads
            _pool = (os.getpid(), ThreadPoolExecutor(WORKERS, thread_name_prefix="kq-digest"))
        return _pool[1]


def _segments(views: Sequence[memoryview], start: int, end: int) -> list[memoryview]:
    """The slices of `views` (concatenated) that hold bytes [start, end)."""
    found, offset = [], 0
    for view in views:
        low, high = max(start, offset), min(end, offset + len(view))
        if low < high:
            found.append(view[low - offset : high - offset])
        offset += len(view)
    return found


def _hash(hasher: Any, data: memoryview) -> None:
    """Hash `data` in steps that fit the core's cache (the pool's task)."""
    for start in range(0, len(data), STEP):
        hasher.update(data[start : start + STEP])


def _read_piece(new: Any, fd: int, start: int, segments: list[memoryview]) -> bytes:
    """Read one piece at file offset `start` into `segments` and return its hash (`new`), a step
    at a time, so each step is hashed while the read left it in the core's cache."""
    hasher, position = new(), start
    for segment in segments:
        for low in range(0, len(segment), STEP):
            step = segment[low : low + STEP]
            done = 0
            while done < len(step):
                count = os.preadv(fd, [step[done:]], position + done)
                if count == 0:
                    raise Mismatch("a file ended early")
                done += count
            position += len(step)
            hasher.update(step)
    return bytes(hasher.digest())
