"""DirectoryStore on real files with real fsync: the commit protocol, retention, permissions,
the restored marker, damaged checkpoints and clean-up."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from kernel_queue.checkpoint import Checkpoint, CheckpointError, DirectoryStore


def commit(store: DirectoryStore, marker: int, payload: bytes = b"data") -> Checkpoint:
    writer = store.begin()
    with writer.open("payload.bin") as file:
        file.write(payload)
    return writer.commit({"marker": marker, "created": 1_700_000_000.0 + marker})


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_the_manifest_is_written_last_and_only_then_the_checkpoint_counts(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "kernel")
    writer = store.begin()
    with writer.open("namespace.pkl") as file:
        file.write(b"x" * 1000)
    (partial,) = (tmp_path / "kernel").iterdir()
    assert partial.name.endswith(".partial")
    assert listing(partial) == ["namespace.pkl"]
    assert store.latest() is None
    assert store.committed() == []

    checkpoint = writer.commit({"marker": 1, "created": 1_700_000_000.0})

    assert listing(tmp_path / "kernel") == [checkpoint.id]
    assert checkpoint.path == tmp_path / "kernel" / checkpoint.id
    assert listing(checkpoint.path) == ["manifest.json", "namespace.pkl"]
    # the digest of a file under one 16 MiB piece: BLAKE3 of that piece's BLAKE3
    digest = "blake3:" + blake3.blake3(blake3.blake3(b"x" * 1000).digest()).hexdigest()
    body = {
        "created": 1_700_000_000.0,
        "digest": "tree-16MiB",
        "files": {"namespace.pkl": {"bytes": 1000, "digest": digest}},
        "marker": 1,
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert json.loads((checkpoint.path / "manifest.json").read_text()) == {
        **body,
        "checksum": "sha256:" + hashlib.sha256(canonical).hexdigest(),
    }
    assert checkpoint.created == 1_700_000_000.0
    assert checkpoint.manifest["marker"] == 1
    assert store.latest() == checkpoint
    assert store.committed() == [checkpoint]


def test_a_directory_without_a_manifest_is_ignored_by_readers(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    first = commit(store, 1)
    later = tmp_path / "00000009-20300101T000000000Z"  # newer id, never committed
    later.mkdir()
    (later / "payload.bin").write_bytes(b"half written")

    assert store.committed() == [first]
    assert store.latest() == first


def test_the_commit_fsyncs_payloads_then_the_manifest_then_its_directory_then_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The order DirectoryWriter.commit promises: payload files fsynced as they close; manifest
    # tmp file fsynced, renamed, checkpoint directory fsynced; `<id>.partial` renamed to `<id>`,
    # root fsynced; only then is an older checkpoint beyond `keep` moved out of sight.
    root = tmp_path / "kernel"
    store = DirectoryStore(root, keep=1)
    old = commit(store, 1)
    steps: list[tuple[str, ...]] = []
    fsync, rename, replace = os.fsync, os.rename, os.replace

    def name(path: str | os.PathLike[str]) -> str:
        return Path(path).relative_to(root.resolve()).as_posix()

    def traced_fsync(fd: int) -> None:
        steps.append(("fsync", name(os.readlink(f"/proc/self/fd/{fd}"))))
        fsync(fd)

    def traced(kind: str, call: Any) -> Any:
        def move(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
            steps.append((kind, name(Path(src).resolve()), name(Path(dst).resolve())))
            call(src, dst)

        return move

    monkeypatch.setattr(os, "fsync", traced_fsync)
    monkeypatch.setattr(os, "rename", traced("rename", rename))
    monkeypatch.setattr(os, "replace", traced("replace", replace))

    writer = store.begin()
    partial = f"{writer.id}.partial"
    for payload in ("a.bin", "b.bin"):
        with writer.open(payload) as file:
            file.write(b"data")
    new = writer.commit({"marker": 2})

    assert steps == [
        ("fsync", f"{partial}/a.bin"),
        ("fsync", f"{partial}/b.bin"),
        ("fsync", f"{partial}/manifest.json.tmp"),
        ("replace", f"{partial}/manifest.json.tmp", f"{partial}/manifest.json"),
        ("fsync", partial),
        ("rename", partial, new.id),
        ("fsync", "."),
        ("rename", old.id, f"{old.id}.deleting"),
        ("fsync", "."),
    ]
    assert store.committed() == [new]


def test_ids_sort_in_creation_order(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, keep=10)
    ids = [commit(store, marker).id for marker in range(12)]
    assert ids == sorted(ids)
    assert [c.id for c in store.committed()] == ids[-10:]
    assert ids[0].startswith("00000001-") and ids[11].startswith("00000012-")


def test_retention_keeps_the_last_keep_committed_checkpoints(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, keep=2)
    checkpoints = [commit(store, marker) for marker in range(4)]
    assert store.committed() == checkpoints[2:]
    assert listing(tmp_path) == [c.id for c in checkpoints[2:]]
    assert [c.manifest["marker"] for c in store.committed()] == [2, 3]


def test_keep_one_still_keeps_the_previous_checkpoint_until_the_new_one_commits(
    tmp_path: Path,
) -> None:
    store = DirectoryStore(tmp_path, keep=1)
    first = commit(store, 1)
    writer = store.begin()
    with writer.open("payload.bin") as file:
        file.write(b"new")
    assert store.latest() == first
    second = writer.commit({"marker": 2})
    assert store.committed() == [second]


def test_directories_are_0700_and_files_0600_whatever_the_umask(
    tmp_path: Path, permissive_umask: None
) -> None:
    root = tmp_path / "checkpoints" / "kernel"
    root.mkdir(parents=True, mode=0o777)
    os.chmod(root, 0o777)
    store = DirectoryStore(root)
    checkpoint = commit(store, 1)
    store.mark_restored(checkpoint)

    assert mode(root) == 0o700
    assert mode(checkpoint.path) == 0o700
    assert {name: mode(checkpoint.path / name) for name in listing(checkpoint.path)} == {
        "manifest.json": 0o600,
        "payload.bin": 0o600,
        "restored": 0o600,
    }


def test_a_new_root_is_created_0700(tmp_path: Path, permissive_umask: None) -> None:
    root = tmp_path / "fresh"
    commit(DirectoryStore(root), 1)
    assert mode(root) == 0o700


def test_a_restored_checkpoint_is_not_offered_again_nor_replaced_by_an_older_one(
    tmp_path: Path,
) -> None:
    # Decision: latest() looks at the newest committed checkpoint only. Once it is restored,
    # an older one would roll the kernel back further, so there is nothing to restore.
    store = DirectoryStore(tmp_path, keep=3)
    commit(store, 1)
    second = commit(store, 2)
    store.mark_restored(second)

    assert store.latest() is None
    assert [c.manifest["marker"] for c in store.committed()] == [1, 2]
    assert listing(second.path) == ["manifest.json", "payload.bin", "restored"]

    third = commit(store, 3)
    assert store.latest() == third


def test_abort_leaves_nothing_behind(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    writer = store.begin()
    with writer.open("a.bin") as file:
        file.write(b"a")
    still_open = writer.open("b.bin")
    still_open.write(b"b")

    writer.abort()
    writer.abort()

    assert listing(tmp_path) == []
    assert store.latest() is None
    with pytest.raises(CheckpointError, match="already committed or aborted"):
        writer.open("c.bin")


def test_abort_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    first = commit(store, 1)
    writer = store.begin()
    with writer.open("payload.bin") as file:
        file.write(b"doomed")
    writer.abort()
    assert listing(tmp_path) == [first.id]
    assert store.latest() == first


def test_a_corrupt_manifest_is_ignored(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, keep=3)
    first = commit(store, 1)
    second = commit(store, 2)
    (second.path / "manifest.json").write_text('{"marker": 2, "fil')
    assert store.committed() == [first]
    assert store.latest() == first


def test_a_checkpoint_whose_payload_file_is_truncated_or_missing_is_ignored(
    tmp_path: Path,
) -> None:
    store = DirectoryStore(tmp_path, keep=3)
    first = commit(store, 1, b"0123456789")
    second = commit(store, 2, b"0123456789")
    third = commit(store, 3, b"0123456789")
    (second.path / "payload.bin").write_bytes(b"01234")
    (third.path / "payload.bin").unlink()
    assert store.committed() == [first]


def test_begin_removes_what_an_interrupted_write_or_deletion_left(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    first = commit(store, 1)
    (tmp_path / "00000007-20300101T000000000Z.partial").mkdir()
    (tmp_path / "00000007-20300101T000000000Z.partial" / "payload.bin").write_bytes(b"x")
    (tmp_path / "00000003-20300101T000000000Z.deleting").mkdir()

    writer = store.begin()

    assert listing(tmp_path) == sorted([first.id, writer.id + ".partial"])
    assert writer.id > first.id
    other = store.begin()  # a second writer does not remove the first one's directory
    assert (tmp_path / (writer.id + ".partial")).is_dir()
    other.abort()
    writer.abort()


def test_payload_names_are_plain_new_file_names(tmp_path: Path) -> None:
    writer = DirectoryStore(tmp_path).begin()
    writer.open("a.npy").close()
    for bad in ("a.npy", "manifest.json", "restored", "../escape", ".hidden", ""):
        with pytest.raises(ValueError, match="cannot create payload file"):
            writer.open(bad)
    writer.abort()


def test_commit_refuses_open_payload_files_and_non_json_manifests(tmp_path: Path) -> None:
    writer = DirectoryStore(tmp_path).begin()
    file = writer.open("a.bin")
    with pytest.raises(CheckpointError, match=r"payload files still open at commit: a\.bin"):
        writer.commit({})
    file.close()
    with pytest.raises(ValueError, match="the manifest is not plain JSON"):
        writer.commit({"when": object()})
    with pytest.raises(
        ValueError, match=r"fields \['checksum', 'files'\] are written by the store"
    ):
        writer.commit({"files": [], "checksum": "x"})
    empty = "blake3:" + blake3.blake3(b"").hexdigest()  # no pieces: the hash of nothing
    assert writer.commit({}).manifest["files"] == {"a.bin": {"bytes": 0, "digest": empty}}


def test_delete_all_removes_every_checkpoint_and_the_root(tmp_path: Path) -> None:
    root = tmp_path / "kernel"
    store = DirectoryStore(root)
    commit(store, 1)
    commit(store, 2)
    store.begin()  # an uncommitted one too

    store.delete_all()
    store.delete_all()

    assert not root.exists()
    assert store.latest() is None
    assert store.committed() == []
    assert listing(tmp_path) == []


def test_keep_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep must be at least 1, not 0"):
        DirectoryStore(tmp_path, keep=0)


def test_directories_the_store_creates_above_its_root_are_0700_too(
    tmp_path: Path, permissive_umask: None
) -> None:
    os.chmod(tmp_path, 0o755)
    commit(DirectoryStore(tmp_path / "checkpoints" / "owner" / "kernel"), 1)
    assert [mode(p) for p in (tmp_path / "checkpoints", tmp_path / "checkpoints" / "owner")] == [
        0o700,
        0o700,
    ]
    assert mode(tmp_path) == 0o755  # what existed is left as it was


def test_a_stray_directory_with_a_huge_number_neither_hides_new_checkpoints_nor_goes(
    tmp_path: Path,
) -> None:
    # Measured before: the next id overflowed the 8-digit pattern, saves "succeeded" and
    # latest() kept returning the old checkpoint.
    store = DirectoryStore(tmp_path, keep=1)
    first = commit(store, 1)
    stray = tmp_path / "99999999-20300101T000000000Z"
    stray.mkdir()
    (stray / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "lost+found").mkdir()

    second = commit(store, 2)
    third = commit(store, 3)

    assert second.id.startswith("100000000-") and third.id.startswith("100000001-")
    assert store.latest() == third
    assert store.committed() == [third]  # keep=1 retired first and second, not the stray
    assert listing(tmp_path) == sorted([third.id, stray.name, "lost+found"])
    assert (stray / "notes.txt").read_text() == "not a checkpoint"
    assert first.id not in listing(tmp_path)


def test_a_signed_store_counts_only_checkpoints_signed_with_its_own_secret(tmp_path: Path) -> None:
    ours = DirectoryStore(tmp_path, keep=5, secret=b"s" * 32)
    theirs = DirectoryStore(tmp_path, keep=5, secret=b"t" * 32)
    unsigned = DirectoryStore(tmp_path, keep=5)
    mine = commit(ours, 1)
    other = commit(theirs, 2)
    plain = commit(unsigned, 3)

    assert ours.committed() == [mine]
    assert ours.latest() == mine
    assert [(c.id, c.kind, c.reason) for c in ours.candidates()] == [
        (plain.id, "foreign", "it carries no signature"),
        (other.id, "foreign", "its signature does not match this kernel's key"),
        (mine.id, "", ""),
    ]
    # A store without a secret (a tool reading a kernel's store) takes signatures on trust.
    assert unsigned.committed() == [mine, other, plain]


def test_set_aside_renames_without_deleting_and_numbering_never_reuses_the_id(
    tmp_path: Path,
) -> None:
    store = DirectoryStore(tmp_path, keep=1)
    first = commit(store, 1, b"first")
    (first.path / "manifest.json").write_text("")
    (candidate,) = store.candidates()
    assert (candidate.kind, candidate.reason) == ("damaged", "its manifest is empty")

    moved = store.set_aside(candidate)

    assert moved == tmp_path / f"{first.id}.damaged"
    assert listing(moved) == ["manifest.json", "payload.bin"]
    assert (moved / "payload.bin").read_bytes() == b"first"
    second = commit(store, 2)
    third = commit(store, 3)
    assert second.id.startswith("00000002-")
    assert listing(tmp_path) == sorted([moved.name, third.id])  # retired second, kept moved


def test_retention_never_deletes_a_damaged_or_foreign_checkpoint(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, keep=1, secret=b"s" * 32)
    planted = commit(DirectoryStore(tmp_path), 1)
    damaged = commit(store, 2)
    (damaged.path / "payload.bin").write_bytes(b"dat")
    kept = [commit(store, marker) for marker in (3, 4, 5)][-1]

    assert listing(tmp_path) == sorted([planted.id, damaged.id, kept.id])


def test_a_file_digested_with_sha256_still_checks_and_an_unknown_hash_is_named(
    tmp_path: Path,
) -> None:
    """Digests name their hash: sha256 (where blake3 is not installed) reads anywhere; a hash
    this kernel lacks is a sentence, never a silent pass."""
    from kernel_queue.checkpoint import digests

    path = tmp_path / "payload"
    data = os.urandom(3 * digests.PIECE + 5)
    path.write_bytes(data)
    for name in ("sha256", "blake3"):
        digest = digests.Digest(name)
        digest.update(data)
        expected = digest.hexdigest()
        assert expected.startswith(f"{name}:")
        assert digests.read(path, len(data), expected) == data
        with pytest.raises(digests.Mismatch, match="does not match its digest"):
            digests.read(path, len(data), expected[:-1] + ("0" if expected[-1] != "0" else "1"))
    with pytest.raises(digests.Mismatch, match="'md5' digest, which this kernel cannot check"):
        digests.read(path, len(data), "md5:00")
