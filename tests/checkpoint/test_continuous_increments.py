"""Incremental checkpoints: a save given the previous checkpoint as its base links the array files
whose bytes did not change (the same inode) and writes the rest; each checkpoint directory still
restores on its own, a damaged shared file is still found by its digest, and retiring old
checkpoints keeps the disk used within the namespace plus the kept increments."""

from __future__ import annotations

import os
import types
from pathlib import Path

import numpy as np
import pytest

import kernel_queue.checkpoint as kc
from kernel_queue.checkpoint import payloads

MIB = 2**20


def namespace() -> types.ModuleType:
    module = types.ModuleType("__main__")
    for index in range(4):
        setattr(module, f"a{index}", np.full(2 * MIB // 8, float(index)))
    module.small = {"lr": 0.1}
    return module


def files(checkpoint: kc.Checkpoint) -> dict[str, os.stat_result]:
    """The array files of `checkpoint`, by the name of the variable they hold."""
    manifest = checkpoint.manifest
    by_file = {e["file"]: e for e in manifest["payload"] if e["kind"] == "ndarray"}
    restored = types.ModuleType("__main__")
    kc.restore(restored, checkpoint)
    found = {}
    for name, entry in by_file.items():
        stat = (checkpoint.path / name).stat()
        # which variable: the arrays are all different, so match on the values restored
        values = {k: v for k, v in vars(restored).items() if isinstance(v, np.ndarray)}
        for variable, value in values.items():
            if value.nbytes + 128 == entry["bytes"] and _holds(checkpoint.path / name, value):
                found[variable] = stat
    return found


def _holds(path: Path, value: np.ndarray) -> bool:
    return bool(np.array_equal(np.load(path), value))


def save(module: types.ModuleType, store: kc.DirectoryStore) -> kc.SaveReport:
    committed = store.committed()
    report = kc.save(module, store, base=committed[-1] if committed else None)
    assert report.checkpoint is not None, report.error
    return report


def test_unchanged_arrays_are_linked_and_the_changed_one_is_written(tmp_path: Path) -> None:
    store = kc.DirectoryStore(tmp_path / "k", keep=3)
    module = namespace()
    first = save(module, store)
    module.a2 = np.full(2 * MIB // 8, 9.0)  # rebound
    module.a3[0] = -1.0  # changed in place: the same object, other bytes
    second = save(module, store)
    assert second.checkpoint is not None and first.checkpoint is not None
    before, after = files(first.checkpoint), files(second.checkpoint)
    for name in ("a0", "a1"):
        assert after[name].st_ino == before[name].st_ino, name  # one file, two directories
    for name in ("a2", "a3"):
        assert after[name].st_ino != before[name].st_ino, name
    assert second.reused == 2 * (2 * MIB + 128)
    assert second.checkpoint.manifest["base"] == first.checkpoint.id
    assert "MB of it changed) in" in kc.summary(second), kc.summary(second)

    restored = types.ModuleType("__main__")
    kc.restore(restored, second.checkpoint)
    assert restored.a3[0] == -1.0 and restored.a3[1] == 3.0  # no stale value
    assert restored.a2[0] == 9.0 and restored.a0[0] == 0.0 and restored.small == {"lr": 0.1}


class Told:
    """A save's `history` that knows which arrays of `module` a cell wrote since the base."""

    def __init__(self, base: kc.SaveReport, module: types.ModuleType, written: set[str]) -> None:
        self.places = base.places
        self.written_ids = {id(getattr(module, name)) for name in written}

    def unchanged(self, array: np.ndarray) -> tuple[int, str] | None:
        if id(array) in self.written_ids:
            return None
        return self.places.get(payloads.place(array))  # type: ignore[arg-type]

    def written(self, array: np.ndarray) -> bool:
        return id(array) in self.written_ids


def test_a_save_told_what_was_written_hashes_no_array_and_links_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kc.DirectoryStore(tmp_path / "k", keep=3)
    module = namespace()
    first = save(module, store)
    module.a3[0] = -1.0
    hashed: list[int] = []
    digest_of = payloads.digest_of
    monkeypatch.setattr(payloads, "digest_of", lambda a: hashed.append(a.nbytes) or digest_of(a))

    told = Told(first, module, {"a3"})
    second = kc.save(module, store, base=first.checkpoint, history=told)

    assert second.checkpoint is not None and first.checkpoint is not None
    assert hashed == []  # a0-a2 linked by the digests told, a3 written without a look
    before, after = files(first.checkpoint), files(second.checkpoint)
    assert [n for n in before if after[n].st_ino == before[n].st_ino] == ["a0", "a1", "a2"]
    assert set(second.places) == set(first.places)  # the next save's base: every array
    restored = types.ModuleType("__main__")
    kc.restore(restored, second.checkpoint)
    assert restored.a3[0] == -1.0 and restored.a3[1] == 3.0 and restored.a2[0] == 2.0


def test_each_directory_restores_alone_after_the_older_one_is_retired(tmp_path: Path) -> None:
    store = kc.DirectoryStore(tmp_path / "k", keep=1)
    module = namespace()
    first = save(module, store)
    module.a1[5] = 42.0
    second = save(module, store)
    assert first.checkpoint is not None and second.checkpoint is not None
    assert not first.checkpoint.path.exists()  # retired: keep=1
    restored = types.ModuleType("__main__")
    kc.restore(restored, second.checkpoint)
    assert restored.a1[5] == 42.0 and restored.a0[0] == 0.0


def test_a_damaged_shared_payload_is_found_by_its_digest(tmp_path: Path) -> None:
    store = kc.DirectoryStore(tmp_path / "k", keep=3)
    module = namespace()
    save(module, store)
    module.small = {"lr": 0.2}
    second = save(module, store)
    assert second.checkpoint is not None and second.reused
    linked = next(e["file"] for e in second.checkpoint.manifest["payload"] if e.get("reused"))
    with open(second.checkpoint.path / linked, "r+b") as file:  # one bit, same size
        file.seek(1000)
        byte = file.read(1)
        file.seek(1000)
        file.write(bytes([byte[0] ^ 1]))
    with pytest.raises(kc.CheckpointDamaged, match="does not match its digest"):
        kc.restore(types.ModuleType("__main__"), second.checkpoint)


def test_many_increments_keep_the_disk_within_the_bound(tmp_path: Path) -> None:
    keep = 2
    store = kc.DirectoryStore(tmp_path / "k", keep=keep)
    module = namespace()
    array_bytes = 2 * MIB + 128
    for cycle in range(10):
        module.a0[cycle] = cycle + 100.0  # one array changes per cell
        save(module, store)
    directories = [p for p in store.root.iterdir() if p.is_dir()]
    assert len(directories) == keep
    inodes: dict[int, int] = {}
    for directory in directories:
        for path in directory.iterdir():
            stat = path.stat()
            inodes[stat.st_ino] = stat.st_size
    arrays = sum(size for size in inodes.values() if size == array_bytes)
    # the namespace's four arrays once, plus the one changed array of the older kept checkpoint
    assert arrays == (4 + keep - 1) * array_bytes
    latest = store.latest()
    assert latest is not None
    restored = types.ModuleType("__main__")
    kc.restore(restored, latest)
    assert [restored.a0[i] for i in range(10)] == [i + 100.0 for i in range(10)]


def test_without_links_the_file_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = kc.DirectoryStore(tmp_path / "k", keep=3)
    module = namespace()
    first = save(module, store)

    def no_links(source: object, target: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    second = save(module, store)
    assert first.checkpoint is not None and second.checkpoint is not None
    assert second.reused  # copied, not written from memory
    before, after = files(first.checkpoint), files(second.checkpoint)
    assert all(after[name].st_ino != before[name].st_ino for name in before)
    assert oct(after["a0"].st_mode & 0o777) == oct(0o600)
    restored = types.ModuleType("__main__")
    kc.restore(restored, second.checkpoint)
    assert restored.a1[0] == 1.0
