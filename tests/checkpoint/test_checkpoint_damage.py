"""Damaged and foreign checkpoints: each kind of damage on real files is detected before anything
loads, set aside (never deleted), and told in a sentence that names the older checkpoint restored
instead, its age and what it lacks; a checkpoint another kernel planted is never unpickled."""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kernel_queue.checkpoint as kc
from kernel_queue.launcher import checkpointing
from tests.launcher.kernels import StartKernel, run, start_kernel
from tests.launcher.processes import KEY

__all__ = ["start_kernel"]  # the real-launcher fixture, shared with the preemption tests

SECRET = kc.derive_secret(KEY.encode())
ELEMENTS = 2**18  # float64: 2 MiB, so `big` goes to its own payload file

Damage = Callable[[Path], None]


def save_state(store: kc.DirectoryStore, **values: Any) -> kc.Checkpoint:
    module = types.ModuleType("__main__")
    vars(module).update(values)
    report = kc.save(module, store)
    assert report.checkpoint is not None, report.error
    return report.checkpoint


def two_checkpoints(store: kc.DirectoryStore) -> tuple[kc.Checkpoint, kc.Checkpoint]:
    """An older checkpoint, then a newer one that also holds `added` and newer values."""
    older = save_state(store, x=1, big=np.ones(ELEMENTS), tiny=np.arange(3))
    newer = save_state(store, x=2, big=np.full(ELEMENTS, 2.0), tiny=np.arange(4), added=[1, 2])
    return older, newer


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def ages(text: str) -> str:
    """`text` with ages as "N s" and byte counts (the pickle's, dill's to decide) as "N B"."""
    return re.sub(r"\(\d+ B\)", "(N B)", re.sub(r"\b\d+ s old", "N s old", text))


def user_names(module: types.ModuleType) -> list[str]:
    return sorted(name for name in vars(module) if not name.startswith("__"))


def cut(name: str) -> Damage:
    def damage(path: Path) -> None:
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[: len(data) // 2])

    return damage


def flip(name: str, where: float) -> Damage:
    """Flip one byte at `where` (a fraction of the file) in place: same size, other bytes."""

    def damage(path: Path) -> None:
        data = bytearray((path / name).read_bytes())
        data[int(len(data) * where)] ^= 0x5A
        (path / name).write_bytes(bytes(data))

    return damage


def write(name: str, text: str) -> Damage:
    return lambda path: (path / name).write_text(text)


def delete(name: str) -> Damage:
    return lambda path: (path / name).unlink()


def drop_key(key: str) -> Damage:
    def damage(path: Path) -> None:
        manifest = json.loads((path / "manifest.json").read_text())
        del manifest[key]
        (path / "manifest.json").write_text(json.dumps(manifest))

    return damage


DIGEST = "does not match its digest (changed after the save)"
DAMAGE = [
    pytest.param(write("manifest.json", ""), "its manifest is empty", False, id="manifest-empty"),
    pytest.param(
        cut("manifest.json"),
        "its manifest is not valid JSON (cut short?)",
        False,
        id="manifest-cut",
    ),
    pytest.param(
        drop_key("payload"),
        "its manifest was changed or cut after it was written",
        True,
        id="manifest-key-missing",
    ),
    pytest.param(
        write("manifest.json", "[1, 2]"),
        "its manifest is not a JSON object",
        False,
        id="manifest-not-an-object",
    ),
    pytest.param(delete("manifest.json"), "it has no manifest.json", False, id="manifest-deleted"),
    pytest.param(
        cut("namespace.pkl"), "its file namespace.pkl is {half} bytes", True, id="pickle-cut"
    ),
    pytest.param(
        flip("namespace.pkl", 0.5), f"its file namespace.pkl {DIGEST}", True, id="pickle-flipped"
    ),
    pytest.param(
        delete("array-0001.npy"), "its file array-0001.npy is missing", True, id="payload-deleted"
    ),
    pytest.param(
        flip("array-0001.npy", 0.6), f"its file array-0001.npy {DIGEST}", True, id="array-flipped"
    ),
    pytest.param(
        flip("array-0001.npy", 0.0002),  # inside the .npy header (its first 128 bytes)
        f"its file array-0001.npy {DIGEST}",
        True,
        id="array-header-flipped",
    ),
    pytest.param(
        flip("small-arrays.bin", 0.5),
        f"its file small-arrays.bin {DIGEST}",
        True,
        id="small-arrays-flipped",
    ),
]


@pytest.mark.parametrize(("damage", "reason", "readable"), DAMAGE)
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_older_one_restored_and_told(
    tmp_path: Path, damage: Damage, reason: str, readable: bool
) -> None:
    store = kc.DirectoryStore(tmp_path / "kernel", secret=SECRET)
    older, newer = two_checkpoints(store)
    sizes = {name: entry["bytes"] for name, entry in newer.manifest["files"].items()}
    damage(newer.path)
    left = files_of(newer.path)
    fresh = types.ModuleType("__main__")

    recovery = kc.recover(fresh, store)

    assert user_names(fresh) == ["big", "tiny", "x"]  # the older state, nothing of the newer
    assert fresh.x == 1 and bool((fresh.big == 1.0).all()) and list(fresh.tiny) == [0, 1, 2]
    reason = reason.format(half=sizes["namespace.pkl"] // 2)
    if reason.endswith(" bytes"):
        reason += f", the manifest says {sizes['namespace.pkl']}"
    lacks = (
        "it lacks added, which only the newer one saved; its other values are N s old"
        if readable
        else "what the newer one held that it lacks cannot be told; its values are N s old"
    )
    assert ages(kc.summary(recovery)) == (
        f"The newest checkpoint could not be restored: checkpoint {newer.id} (N s old) is "
        f"damaged: {reason}; it was moved aside to {newer.id}.damaged for inspection. Restored "
        f"the older checkpoint {older.id} instead: restored 3 variables (2.1 MB) from a "
        f"checkpoint N s old; {lacks}."
    )
    aside = tmp_path / "kernel" / f"{newer.id}.damaged"
    assert files_of(aside) == left  # kept for inspection exactly as found
    assert sorted(p.name for p in (tmp_path / "kernel").iterdir()) == [older.id, aside.name]
    assert (older.path / "restored").exists()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(flip("tensor-0001.pt", 0.5), DIGEST, id="storage-flipped"),
        pytest.param(flip("tensor-0001.pt", 0.00005), DIGEST, id="pickle-in-zip-flipped"),
        pytest.param(flip("tensor-0001.pt", 0.99999), DIGEST, id="zip-directory-flipped"),
        pytest.param(cut("tensor-0001.pt"), "is {half} bytes, the manifest says {size}", id="cut"),
    ],
)
def test_a_damaged_tensor_file_is_refused_and_nothing_is_restored(
    tmp_path: Path, damage: Damage, reason: str
) -> None:
    torch = pytest.importorskip("torch")
    store = kc.DirectoryStore(tmp_path / "kernel", secret=SECRET)
    checkpoint = save_state(store, x=1, weights=torch.arange(2**19, dtype=torch.float32))
    size = checkpoint.manifest["files"]["tensor-0001.pt"]["bytes"]
    damage(checkpoint.path)
    fresh = types.ModuleType("__main__")

    with pytest.raises(kc.CheckpointDamaged) as refused:
        kc.restore(fresh, checkpoint)

    assert str(refused.value) == (
        f"checkpoint {checkpoint.id} is damaged: its file tensor-0001.pt "
        + reason.format(half=size // 2, size=size)
    )
    assert user_names(fresh) == []


def test_when_every_checkpoint_is_damaged_the_kernel_is_told_it_starts_empty(
    tmp_path: Path,
) -> None:
    store = kc.DirectoryStore(tmp_path / "kernel", secret=SECRET)
    older, newer = two_checkpoints(store)
    flip("array-0001.npy", 0.5)(older.path)
    (newer.path / "manifest.json").write_text("")
    fresh = types.ModuleType("__main__")

    recovery = kc.recover(fresh, store)

    assert recovery.report is None and user_names(fresh) == []
    assert ages(kc.summary(recovery)) == (
        f"No checkpoint could be restored: checkpoint {newer.id} (N s old) is damaged: its "
        f"manifest is empty; it was moved aside to {newer.id}.damaged for inspection; "
        f"checkpoint {older.id} (N s old) is damaged: its file array-0001.npy {DIGEST}; it was "
        f"moved aside to {older.id}.damaged for inspection. The kernel starts empty."
    )
    assert sorted(p.name for p in (tmp_path / "kernel").iterdir()) == [
        f"{older.id}.damaged",
        f"{newer.id}.damaged",
    ]


class Planted:
    """Unpickling this touches `marker`: proof that a planted pickle ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize(
    ("planter", "reason"),
    [
        pytest.param(
            kc.derive_secret(b"another kernel's key"),
            "its signature does not match this kernel's key",
            id="other-key",
        ),
        pytest.param(None, "it carries no signature", id="unsigned"),
    ],
)
def test_a_checkpoint_this_kernel_did_not_write_is_never_unpickled_and_is_told(
    tmp_path: Path, planter: bytes | None, reason: str
) -> None:
    root = tmp_path / "kernel"
    store = kc.DirectoryStore(root, secret=SECRET)
    own = save_state(store, x=1)
    marker = tmp_path / "code-ran"
    planted = save_state(kc.DirectoryStore(root, secret=planter), x=666, bait=Planted(marker))
    assert planted.id > own.id
    fresh = types.ModuleType("__main__")

    recovery = kc.recover(fresh, store)

    assert not marker.exists()
    assert user_names(fresh) == ["x"] and fresh.x == 1
    assert ages(kc.summary(recovery)) == (
        f"A checkpoint not written by this kernel was found and ignored ({planted.id}: "
        f"{reason}; moved aside to {planted.id}.foreign). Restored 1 variable (N B) from a "
        "checkpoint N s old"
    )
    assert (root / f"{planted.id}.foreign" / "namespace.pkl").exists()


def test_a_planted_checkpoint_alone_is_told_and_nothing_is_restored(tmp_path: Path) -> None:
    root = tmp_path / "kernel"
    marker = tmp_path / "code-ran"
    planted = save_state(kc.DirectoryStore(root), bait=Planted(marker))
    fresh = types.ModuleType("__main__")

    recovery = kc.recover(fresh, kc.DirectoryStore(root, secret=SECRET))

    assert not marker.exists() and user_names(fresh) == []
    assert kc.summary(recovery) == (
        f"A checkpoint not written by this kernel was found and ignored ({planted.id}: it "
        f"carries no signature; moved aside to {planted.id}.foreign). There was nothing else to "
        "restore."
    )


def test_a_checkpoint_that_does_not_load_here_is_left_in_place_and_nothing_of_it_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kq_vanishing.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import kq_vanishing  # type: ignore[import-not-found]

    store = kc.DirectoryStore(tmp_path / "kernel", secret=SECRET)
    older = save_state(store, x=1)
    newer = save_state(store, x=2, thing=kq_vanishing.Thing())
    monkeypatch.delitem(sys.modules, "kq_vanishing")
    (tmp_path / "kq_vanishing.py").unlink()
    fresh = types.ModuleType("__main__")

    recovery = kc.recover(fresh, store)

    assert user_names(fresh) == ["x"] and fresh.x == 1  # not x = 2 from the half-loaded one
    assert ages(kc.summary(recovery)) == (
        f"The newest checkpoint could not be restored: checkpoint {newer.id} (N s old) could "
        "not be loaded (ModuleNotFoundError: No module named 'kq_vanishing'). Restored the older "
        f"checkpoint {older.id} instead: restored 1 variable (N B) from a checkpoint N s old; it "
        "lacks thing, which only the newer one saved; its other values are N s old."
    )
    assert newer.path.is_dir()  # not damaged: a kernel with the module could still load it


def test_a_checkpoint_of_an_older_format_is_told_and_left_in_place(tmp_path: Path) -> None:
    root = tmp_path / "kernel"
    old = root / "00000001-20260101T000000000Z"
    old.mkdir(parents=True)
    (old / "namespace.pkl").write_bytes(b"\x80\x05N.")
    manifest = {"format": 1, "created": 1_700_000_000.0, "files": {"namespace.pkl": 4}}
    (old / "manifest.json").write_text(json.dumps(manifest))

    recovery = kc.recover(types.ModuleType("__main__"), kc.DirectoryStore(root, secret=SECRET))

    assert re.sub(r"\(\d+ days old\)", "(N days old)", kc.summary(recovery)) == (
        f"No checkpoint could be restored: checkpoint {old.name} (N days old) cannot be read "
        "here: it was written in checkpoint format 1, but this kernel-queue reads format 2 only; "
        "restore it with the kernel-queue version that wrote it, or start afresh. The kernel "
        "starts empty."
    )
    assert sorted(p.name for p in root.iterdir()) == [old.name]


def test_an_older_checkpoint_restored_once_is_offered_again_only_when_a_newer_one_was_lost(
    tmp_path: Path,
) -> None:
    store = kc.DirectoryStore(tmp_path / "kernel", secret=SECRET)
    older = save_state(store, x=1)
    store.mark_restored(older)
    assert kc.recover(types.ModuleType("__main__"), store) == kc.Recovery(None)

    newer = save_state(store, x=2)
    (newer.path / "manifest.json").write_text("{")
    fresh = types.ModuleType("__main__")
    recovery = kc.recover(fresh, store)

    assert fresh.x == 1
    assert recovery.report is not None and recovery.report.checkpoint == older
    assert [(p.id, p.kind) for p in recovery.problems] == [(newer.id, "damaged")]


def test_the_kernel_signs_with_a_secret_from_its_connection_file_and_refuses_planted_ones(
    tmp_path: Path,
) -> None:
    connection = tmp_path / "kernel.json"
    connection.write_text(json.dumps({"key": KEY, "shell_port": 1}))
    root = tmp_path / "kernel"
    environ = {"KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR": str(root)}
    options = checkpointing.Options.from_env(environ, str(connection))
    assert options is not None and options.secret == SECRET
    assert "secret" not in repr(options)
    own = save_state(kc.DirectoryStore(root, secret=options.secret), x=1)
    planted = save_state(kc.DirectoryStore(root, secret=b"\0" * 32), x=2)

    preemption = checkpointing.prepare(options)

    assert preemption.module.x == 1
    assert preemption._restore_summary is not None
    assert ages(preemption._restore_summary) == (
        f"A checkpoint not written by this kernel was found and ignored ({planted.id}: its "
        f"signature does not match this kernel's key; moved aside to {planted.id}.foreign). "
        "Restored 1 variable (N B) from a checkpoint N s old\nRestored: x."
    )
    # marked restored once the kernel runs code (its first request), not before: a kernel
    # killed before that restores the same state again
    assert own.path.is_dir() and not (own.path / "restored").exists()
    assert preemption.restored == own


def test_a_launched_kernel_refuses_a_planted_checkpoint_and_says_so_in_the_notebook(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    marker = tmp_path / "code-ran"
    planted = save_state(
        kc.DirectoryStore(store, secret=kc.derive_secret(b"not this kernel's key")),
        stolen=1,
        bait=Planted(marker),
    )
    kernel = start_kernel(store)

    cell = run(kernel.client(), "'stolen' in globals()")

    assert cell.reply["status"] == "ok"
    assert cell.streams() == [
        f"A checkpoint not written by this kernel was found and ignored ({planted.id}: its "
        f"signature does not match this kernel's key; moved aside to {planted.id}.foreign). "
        "There was nothing else to restore.\n"
    ]
    assert not marker.exists()
    left = sorted(p.name for p in store.iterdir() if p.name.startswith(planted.id))
    assert left == [f"{planted.id}.foreign"]  # beside it only the cell's own checkpoint
