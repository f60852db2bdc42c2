"""Checkpoint stores for tests that watch or slow down a real DirectoryStore's writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO, Self

import kernel_queue.checkpoint as kc


class DelegatingStore:
    """A CheckpointStore that is also its own CheckpointWriter, passing every call on to
    `store` and the writer it began; subclasses override only the calls they watch or slow."""

    def __init__(self, store: kc.DirectoryStore) -> None:
        self.store = store

    def begin(self) -> Self:
        self.writer = self.store.begin()
        return self

    def open(self, name: str) -> BinaryIO:
        return self.writer.open(name)

    def commit(self, manifest: Any) -> kc.Checkpoint:
        return self.writer.commit(manifest)

    def abort(self) -> None:
        self.writer.abort()

    def latest(self) -> kc.Checkpoint | None:
        return self.store.latest()

    def committed(self) -> list[kc.Checkpoint]:
        return self.store.committed()

    def mark_restored(self, checkpoint: kc.Checkpoint) -> None:
        self.store.mark_restored(checkpoint)

    def candidates(self) -> list[kc.Candidate]:
        return self.store.candidates()

    def set_aside(self, candidate: kc.Candidate) -> Path:
        return self.store.set_aside(candidate)

    def delete_all(self) -> None:
        self.store.delete_all()
