"""Crash safety: a child process writes checkpoints in a loop and is SIGKILLed at random moments,
some while payload files are written, some inside the commit. After every kill a fresh store must
offer a checkpoint that restores to exactly one of the states written, never an older one."""

from __future__ import annotations

import mmap
import os
import random
import signal
import struct
import time
import types
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest

import kernel_queue.checkpoint as kc
from tests.checkpoint_stores import DelegatingStore

KILLS = 120
ELEMENTS = 2**18  # int64: 2 MiB, written out of band like a real array
PHASES = {0: "starting", 1: "payload", 2: "commit", 3: "between"}
# shared memory: phase (byte 0), last marker whose save() returned (int64 at offset 8)
_PHASE, _LAST = 0, 8


class TracingStore(DelegatingStore):
    """A DirectoryStore that tells the parent which phase a write is in."""

    def __init__(self, store: kc.DirectoryStore, shared: mmap.mmap) -> None:
        super().__init__(store)
        self.shared = shared

    def open(self, name: str) -> BinaryIO:
        self.shared[_PHASE] = 1
        return super().open(name)

    def link(self, name: str, source: Path, size: int, digest: str) -> bool:
        self.shared[_PHASE] = 1
        linked: bool = self.writer.link(name, source, size, digest)
        return linked

    def commit(self, manifest: Any) -> kc.Checkpoint:
        self.shared[_PHASE] = 2
        checkpoint = super().commit(manifest)
        self.shared[_PHASE] = 3
        return checkpoint


FROZEN = np.arange(ELEMENTS, dtype=np.int64)
"""An array no save changes: incremental saves link its file from the previous checkpoint."""


def write_forever(
    root: Path, first_marker: int, shared: mmap.mmap, seed: int, incremental: bool = False
) -> None:
    """The child: save checkpoints with markers first_marker, first_marker + 1, ... until killed;
    `incremental`: each with the newest committed one as its base (as continuous saves are)."""
    rng = random.Random(seed)

    def jitter(call: Any) -> Any:
        def slowed(*args: Any, **kwargs: Any) -> Any:
            time.sleep(rng.random() * 0.002)  # spread the commit's steps so kills land between
            return call(*args, **kwargs)

        return slowed

    os.fsync, os.replace, os.rename = jitter(os.fsync), jitter(os.replace), jitter(os.rename)
    store = TracingStore(kc.DirectoryStore(root, keep=2), shared)
    state = types.ModuleType("state")
    marker = first_marker
    while True:
        state.marker = marker
        state.data = np.full(ELEMENTS, marker, dtype=np.int64)
        state.alias = state.data
        state.info = {"marker": marker, "tag": f"m{marker}"}
        state.frozen = FROZEN
        committed = store.committed() if incremental else []
        report = kc.save(state, store, base=committed[-1] if committed else None)
        if report.checkpoint is None:
            raise RuntimeError(report.error)
        struct.pack_into("q", shared, _LAST, marker)
        marker += 1


def wait_for_phase(shared: mmap.mmap, phase: int, limit: float = 5.0) -> None:
    give_up = time.monotonic() + limit
    while shared[_PHASE] != phase:
        assert time.monotonic() < give_up, f"the child never reached phase {PHASES[phase]}"
        time.sleep(0.0002)


def check_restorable(root: Path, oldest: int, newest: int) -> int | None:
    """Restore the store's latest checkpoint; it must be one complete state, not older than the
    last save() that returned. Returns its marker."""
    checkpoint = kc.DirectoryStore(root, keep=2).latest()
    if checkpoint is None:
        return None
    state = types.ModuleType("state")
    kc.restore(state, checkpoint)
    marker = state.marker
    assert oldest <= marker <= newest, (oldest, marker, newest)
    assert state.info == {"marker": marker, "tag": f"m{marker}"}
    assert state.alias is state.data
    assert state.data.shape == (ELEMENTS,) and bool((state.data == marker).all())
    assert np.array_equal(getattr(state, "frozen", FROZEN), FROZEN)
    return int(marker)


@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_a_kill_at_any_moment_never_damages_the_previous_checkpoint(
    tmp_path: Path, incremental: bool
) -> None:
    root = tmp_path / "kernel"
    rng = random.Random(20260130)
    shared = mmap.mmap(-1, 16)
    phases_at_kill: Counter[str] = Counter()
    # The previous checkpoint every kill must leave intact; without it, a run whose children
    # were all killed before their first commit would test nothing (saves take ~0.1 s).
    first = types.ModuleType("state")
    first.marker, first.info = 50, {"marker": 50, "tag": "m50"}
    first.data = first.alias = np.full(ELEMENTS, 50, dtype=np.int64)
    first.frozen = FROZEN
    assert kc.save(first, kc.DirectoryStore(root, keep=2)).checkpoint is not None
    committed_marker = 50  # the newest marker whose save() returned so far
    started = time.monotonic()

    for child in range(1, KILLS + 1):
        first_marker = child * 100_000
        shared[_PHASE] = 0
        struct.pack_into("q", shared, _LAST, -1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child is killed, never returns
            try:
                write_forever(root, first_marker, shared, seed=child, incremental=incremental)
            finally:
                os._exit(1)

        try:
            mode = child % 3
            if mode == 1:
                wait_for_phase(shared, 1)
                time.sleep(rng.random() * 0.004)
            elif mode == 2:
                wait_for_phase(shared, 2)
                time.sleep(rng.random() * 0.008)
            else:
                time.sleep(rng.random() * 0.08)
            phases_at_kill[PHASES[shared[_PHASE]]] += 1
        finally:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status

        (last_returned,) = struct.unpack_from("q", shared, _LAST)
        if last_returned >= 0:
            committed_marker = last_returned
        newest_possible = first_marker + 10_000
        marker = check_restorable(root, committed_marker, newest_possible)
        assert marker is not None, "no checkpoint after one had been committed"
        committed_marker = max(committed_marker, marker)

    elapsed = time.monotonic() - started
    assert phases_at_kill["payload"] >= 20, phases_at_kill
    assert phases_at_kill["commit"] >= 20, phases_at_kill
    print(f"{KILLS} kills in {elapsed:.1f} s: {dict(phases_at_kill)}")

    # The next writer cleans up whatever the kills left half-written or half-deleted.
    store = kc.DirectoryStore(root, keep=2)
    state = types.ModuleType("state")
    state.marker, state.info = 1, {"marker": 1, "tag": "m1"}
    state.data = state.alias = np.full(ELEMENTS, 1, dtype=np.int64)
    state.frozen = FROZEN
    base = store.committed()[-1] if incremental else None
    assert kc.save(state, store, base=base).checkpoint is not None
    assert [p.name for p in sorted(root.iterdir())] == [c.id for c in store.committed()]
    assert len(store.committed()) == 2
    if incremental:  # the unchanged array's file is the older checkpoint's, linked
        older, newer = store.committed()
        [linked] = [e["file"] for e in newer.manifest["payload"] if e.get("reused")]
        inode = (newer.path / linked).stat().st_ino
        assert inode in {path.stat().st_ino for path in older.path.iterdir()}
