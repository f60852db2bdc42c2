"""save/restore of a kernel namespace: real fresh Python processes play the preempted kernel and
the re-admitted one (so the `__main__` gotchas are real), plus in-process checks of layouts,
deadlines, format versions and the sentences users read. Torch tests run only if torch imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any, BinaryIO

import blake3
import numpy as np
import pytest

import kernel_queue.checkpoint as kc
from kernel_queue.checkpoint import digests, payloads
from tests.checkpoint_stores import DelegatingStore

KERNEL_BEFORE = """
import json, socket, sys
import numpy as np
import kernel_queue.checkpoint as kc

count = 7
settings = {"lr": 0.5, "layers": [3, 4]}
weights = np.arange(50 * 2**20 // 8, dtype=np.float64)  # 50 MiB
alias = weights
square = lambda v: v * v
def scaled(v):
    return v * settings["lr"] * count
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x**2 + self.y**2
point = Point(3, 4)
sock = socket.socket()
gen = (i for i in range(3))
class Oops(Exception):
    pass
try:
    raise Oops("caught, as IPython would record it")
except Oops:
    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()

report = kc.save(
    sys.modules["__main__"],
    kc.DirectoryStore(sys.argv[1]),
    extra={"kernel_id": "k-1", "reason": "preempted"},
)
print(json.dumps({
    "summary": kc.summary(report),
    "saved": [name for name, _ in report.saved],
    "skipped": report.skipped,
    "error": report.error,
    "last_type_after_save": sys.last_type.__name__,
    "sock_still_in_namespace": "sock" in globals(),
}))
sock.close()
"""

KERNEL_AFTER = """
import json, sys
import kernel_queue.checkpoint as kc

store = kc.DirectoryStore(sys.argv[1])
checkpoint = store.latest()
report = kc.restore(sys.modules["__main__"], checkpoint)
store.mark_restored(checkpoint)
print(json.dumps({
    "summary": kc.summary(report),
    "restored": [name for name, _ in report.restored],
    "skipped": report.skipped,
    "count": count,
    "settings": settings,
    "weights": [weights.dtype.str, weights.shape[0], float(weights[12345]), float(weights[-1])],
    "alias is weights": alias is weights,
    "square(7)": square(7),
    "scaled(10)": scaled(10),
    "point": [type(point).__name__, isinstance(point, Point), point.norm2()],
    "Point(1, 2).norm2()": Point(1, 2).norm2(),
    "Oops is an exception class": issubclass(Oops, Exception),
    "sock or gen present": "sock" in globals() or "gen" in globals(),
    "np is numpy": np.__name__,
    "__name__": __name__,
    "manifest": {k: checkpoint.manifest[k] for k in ("kernel_id", "reason", "format")},
    "latest after mark_restored": store.latest(),
}))
"""


def run_kernel(tmp_path: Path, source: str, *args: str) -> Any:
    script = tmp_path / f"kernel_{len(list(tmp_path.glob('kernel_*.py')))}.py"
    script.write_text(textwrap.dedent(source))
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def digest_of(data: bytes) -> str:
    """A payload's digest: BLAKE3 over the BLAKE3 of each 16 MiB piece."""
    pieces = [data[i : i + (16 << 20)] for i in range(0, len(data), 16 << 20)]
    tops = b"".join(blake3.blake3(p).digest() for p in pieces)
    return "blake3:" + blake3.blake3(tops).hexdigest()


def make_module(source: str, name: str = "kernelns") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)
    return module


def restore_fresh(checkpoint: kc.Checkpoint | None) -> types.ModuleType:
    """A new, empty kernel namespace with `checkpoint` restored into it."""
    assert checkpoint is not None
    fresh = types.ModuleType("kernelns")
    kc.restore(fresh, checkpoint)
    return fresh


def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> Path:
    """Module `name` written in `tmp_path`, which is on sys.path for this test; its file."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def test_a_kernel_namespace_is_restored_in_a_fresh_process(tmp_path: Path) -> None:
    root = str(tmp_path / "checkpoints")
    before = run_kernel(tmp_path, KERNEL_BEFORE, root)
    skipped = [
        ["sock", "socket", "cannot pickle 'socket' object"],
        ["gen", "generator", "cannot pickle 'generator' object"],
    ]
    assert before["error"] == ""
    assert before["saved"] == [
        "count", "settings", "weights", "alias", "square", "scaled", "Point", "point", "Oops"
    ]  # fmt: skip
    assert before["skipped"] == skipped
    assert re.sub(r"in \d+\.\d s", "in N s", before["summary"]) == (
        "saved 9 variables (52.4 MB) in N s; not saved: sock (socket: cannot pickle 'socket' "
        "object), gen (generator: cannot pickle 'generator' object)"
    )
    assert before["last_type_after_save"] == "Oops"
    assert before["sock_still_in_namespace"] is True

    after = run_kernel(tmp_path, KERNEL_AFTER, root)

    age = re.sub(r"a checkpoint \d+ s old", "a checkpoint N s old", after["summary"])
    assert {**after, "summary": age} == {
        "summary": "restored 9 variables (52.4 MB) from a checkpoint N s old; "
        "not restored: sock (socket), gen (generator)",
        "restored": before["saved"],
        "skipped": skipped,
        "count": 7,
        "settings": {"lr": 0.5, "layers": [3, 4]},
        "weights": ["<f8", 6553600, 12345.0, 6553599.0],
        "alias is weights": True,
        "square(7)": 49,
        "scaled(10)": 35.0,
        "point": ["Point", True, 25],
        "Point(1, 2).norm2()": 5,
        "Oops is an exception class": True,
        "sock or gen present": False,
        "np is numpy": "numpy",
        "__name__": "__main__",
        "manifest": {"kernel_id": "k-1", "reason": "preempted", "format": 2},
        "latest after mark_restored": None,
    }


def test_one_checkpoint_layout_on_disk(tmp_path: Path) -> None:
    module = make_module("""
        import numpy as np
        big = np.ones((512, 512))        # 2 MiB: its own file
        same = big
        small = np.arange(10)            # packed with other small arrays: small-arrays.bin
        text = "hello"
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path), extra={"kernel_id": "k-2"})
    assert report.checkpoint is not None
    manifest = dict(report.checkpoint.manifest)
    assert sorted(p.name for p in report.checkpoint.path.iterdir()) == [
        "array-0001.npy",
        "manifest.json",
        "namespace.pkl",
        "small-arrays.bin",
    ]
    assert sorted(manifest) == [
        "bytes", "checksum", "consistency", "created", "digest", "files", "format", "kernel_id",
        "module", "namespace", "payload", "pickle_protocol", "reused", "saved", "seconds",
        "skipped", "versions",
    ]  # fmt: skip
    assert manifest["format"] == kc.FORMAT_VERSION == 2
    assert manifest["module"] == "kernelns"
    assert manifest["consistency"] == "consistent"
    assert manifest["pickle_protocol"] == 5
    torch = ["torch"] if "torch" in sys.modules else []  # imported by a torch test before
    assert sorted(manifest["versions"]) == ["dill", "numpy", "python", *torch]
    assert [(e["name"], e["type"]) for e in manifest["saved"]] == [
        ("big", "ndarray"), ("same", "ndarray"), ("small", "ndarray"), ("text", "str")
    ]  # fmt: skip
    assert manifest["saved"][0]["bytes"] == 2 * 2**20
    assert manifest["skipped"] == []
    assert manifest["payload"][1] == {
        "file": "array-0001.npy", "kind": "ndarray", "shape": [512, 512], "dtype": "<f8",
        "bytes": 2 * 2**20 + 128,
    }  # fmt: skip
    assert manifest["payload"][2] == {
        "file": "small-arrays.bin", "kind": "small-arrays", "count": 1, "bytes": 80
    }  # fmt: skip
    assert manifest["payload"][0]["file"] == "namespace.pkl"
    assert {name: entry["bytes"] for name, entry in manifest["files"].items()} == {
        e["file"]: e["bytes"] for e in manifest["payload"]
    }
    array = (report.checkpoint.path / "array-0001.npy").read_bytes()
    assert manifest["files"]["array-0001.npy"]["digest"] == digest_of(array)
    assert manifest["bytes"] == report.bytes == sum(e["bytes"] for e in manifest["payload"])


def test_arrays_of_every_layout_round_trip(tmp_path: Path) -> None:
    memmap = np.memmap(tmp_path / "data.mm", dtype=np.int32, mode="w+", shape=(1024, 512))
    memmap[:] = np.arange(1024 * 512, dtype=np.int32).reshape(1024, 512)
    module = make_module("""
        import numpy as np
        c_order = np.random.default_rng(0).random((700, 300))
        f_order = np.asfortranarray(c_order)
        strided = np.arange(2_000_000, dtype=np.float64).reshape(1000, 2000)[::3, ::2]
        records = np.zeros(100_000, dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S7")])
        records["a"] = np.arange(100_000)
        when = np.arange(200_000).astype("datetime64[s]")
        objects = np.array([{"k": i} for i in range(200_000)], dtype=object)
        tiny = np.arange(5)
    """)
    module.memmap = memmap
    expected = {name: np.array(value) for name, value in vars(module).items()
                if isinstance(value, np.ndarray)}  # fmt: skip
    report = kc.save(module, kc.DirectoryStore(tmp_path / "store"))
    assert report.checkpoint is not None, report.error
    kinds = {e["file"].split("-")[0] for e in report.checkpoint.manifest["payload"]}
    assert kinds == {"namespace.pkl", "array", "small"}
    del memmap, module.memmap

    fresh = restore_fresh(report.checkpoint)

    for name, value in expected.items():
        restored = getattr(fresh, name)
        assert type(restored) is np.ndarray, name
        assert restored.dtype == value.dtype, name
        assert np.array_equal(restored, value), name
    assert fresh.f_order.flags.f_contiguous
    assert fresh.objects[123] == {"k": 123}


def test_hidden_private_and_module_names_are_not_saved_as_variables(tmp_path: Path) -> None:
    module = make_module("""
        import json
        import numpy as np
        In = ["x = 1"]
        _private = 1
        _5 = "an output"
        exit = object()
        x = 1
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path), hidden={"In", "exit"})
    assert report.saved == (("x", 5),)
    assert report.skipped == ()

    fresh = restore_fresh(report.checkpoint)
    assert sorted(k for k in vars(fresh) if not k.startswith("__")) == ["json", "np", "x"]
    assert fresh.np is np


def test_a_name_imported_from_a_module_that_is_gone_is_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = importable(
        tmp_path, monkeypatch, "kq_gone_mod", "LIMIT = 7\ndef helper():\n    return 1\n"
    )
    module = make_module("""
        import kq_gone_mod
        from kq_gone_mod import LIMIT, helper
        kept = [1, 2]
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path / "store"))
    assert [name for name, _ in report.saved] == ["LIMIT", "helper", "kept"]
    monkeypatch.delitem(sys.modules, "kq_gone_mod")
    gone.unlink()

    fresh = types.ModuleType("kernelns")
    restored = kc.restore(fresh, report.checkpoint)  # type: ignore[arg-type]

    assert (fresh.kept, fresh.LIMIT) == ([1, 2], 7)  # a number imported by name keeps its value
    assert [name for name, _ in restored.restored] == ["LIMIT", "kept"]
    assert restored.skipped == (
        ("helper", "reference", "kq_gone_mod.helper: No module named 'kq_gone_mod'"),
        ("kq_gone_mod", "module", "No module named 'kq_gone_mod'"),
    )
    assert kc.summary(restored).endswith("not restored: helper (reference), kq_gone_mod (module)")


def test_save_leaves_the_namespace_and_sys_last_untouched(tmp_path: Path) -> None:
    module = make_module("""
        import threading
        lock_holder = {"sock": __import__("socket").socket()}
        value = 3
    """)
    namespace = dict(vars(module))
    last = getattr(sys, "last_type", None)
    sys.last_type = KeyError
    try:
        report = kc.save(module, kc.DirectoryStore(tmp_path))
        assert sys.last_type is KeyError
    finally:
        if last is None:
            del sys.last_type
        else:
            sys.last_type = last
        module.lock_holder["sock"].close()
    assert vars(module) == namespace
    assert [name for name, _, _ in report.skipped] == ["lock_holder"]


def test_functions_keep_their_globals_in_a_module_of_another_name(tmp_path: Path) -> None:
    module = make_module(
        """
        factor = 3
        def times(v):
            return v * factor
        namespace = globals()
        holder = {"namespace": globals()}
        """,
        name="first",
    )
    module.me = module
    module.holder["module"] = module
    report = kc.save(module, kc.DirectoryStore(tmp_path))
    second = types.ModuleType("second")
    kc.restore(second, report.checkpoint)  # type: ignore[arg-type]
    assert second.__name__ == "second"
    assert second.times.__globals__ is vars(second)
    assert second.namespace is vars(second)
    assert second.me is second
    assert second.holder == {"namespace": vars(second), "module": second}
    second.factor = 10
    assert second.times(2) == 20


def saved_once(
    directory: Path, source: str
) -> tuple[kc.DirectoryStore, types.ModuleType, kc.Checkpoint | None]:
    """A store in `directory` holding one checkpoint of the namespace `source` makes: the store,
    the namespace and the checkpoint."""
    store = kc.DirectoryStore(directory)
    module = make_module(source)
    return store, module, kc.save(module, store).checkpoint


def assert_only(directory: Path, first: kc.Checkpoint | None) -> None:
    """The store in `directory` holds `first` and nothing else, nothing half-written beside it."""
    assert first is not None
    assert kc.DirectoryStore(directory).latest() == first
    assert [p.name for p in directory.iterdir()] == [first.id]


def test_a_deadline_already_past_commits_nothing_and_keeps_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    store, module, first = saved_once(tmp_path, "x = 1")
    module.x = 2

    report = kc.save(module, store, deadline=time.monotonic() - 1)

    assert (report.checkpoint, report.error, report.saved) == (None, "deadline", ())
    assert re.sub(r"after \d+\.\d s", "after N s", kc.summary(report)) == (
        "checkpoint not saved after N s (the deadline passed); any earlier one is kept"
    )
    assert_only(tmp_path, first)


class SlowStore(DelegatingStore):
    """A DirectoryStore whose payload files take `delay` seconds each to open."""

    def __init__(self, store: kc.DirectoryStore, delay: float) -> None:
        super().__init__(store)
        self.delay = delay

    def open(self, name: str) -> BinaryIO:
        time.sleep(self.delay)
        return super().open(name)


def test_a_deadline_passing_while_arrays_are_written_aborts_the_checkpoint(
    tmp_path: Path,
) -> None:
    store, module, first = saved_once(tmp_path, "import numpy as np\nx = 1")
    module.a, module.b = np.ones(2**18), np.zeros(2**18)  # 2 MiB each

    # namespace.pkl opens at +0.2 s, a's file at +0.4 s: its first chunk is past the deadline
    report = kc.save(module, SlowStore(store, 0.2), deadline=time.monotonic() + 0.3)

    assert (report.checkpoint, report.error) == (None, "deadline")
    assert_only(tmp_path, first)


def test_an_error_while_saving_is_reported_not_raised(tmp_path: Path) -> None:
    (tmp_path / "not-a-directory").write_text("")
    report = kc.save(make_module("x = 1"), kc.DirectoryStore(tmp_path / "not-a-directory"))
    assert report.checkpoint is None
    assert report.error.startswith("FileExistsError: [Errno 17] File exists")


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    store, module = kc.DirectoryStore(tmp_path / "store"), make_module("x = 1")
    with pytest.raises(ValueError, match="consistency must be one of"):
        kc.save(module, store, consistency="eventually")
    with pytest.raises(ValueError, match=r"clash with the manifest's own: \['files', 'format'\]"):
        kc.save(module, store, extra={"format": 9, "files": 1, "kernel_id": "k"})
    assert not (tmp_path / "store").exists()


def test_a_checkpoint_of_another_format_is_refused_with_both_versions_named(
    tmp_path: Path,
) -> None:
    checkpoint = kc.save(make_module("x = 1"), kc.DirectoryStore(tmp_path)).checkpoint
    assert checkpoint is not None
    older = kc.Checkpoint(checkpoint.id, checkpoint.path, checkpoint.created, {"format": 1})

    with pytest.raises(kc.FormatMismatch) as caught:
        kc.restore(types.ModuleType("kernelns"), older)
    assert str(caught.value) == (
        f"checkpoint {checkpoint.id} was written in checkpoint format 1, but this kernel-queue "
        "reads format 2 only; restore it with the kernel-queue version that wrote it, or start "
        "afresh"
    )
    assert isinstance(caught.value, kc.CheckpointError)


def test_a_concurrent_save_is_recorded_and_told_on_restore(tmp_path: Path) -> None:
    report = kc.save(make_module("x = 1"), kc.DirectoryStore(tmp_path), consistency="concurrent")
    assert report.checkpoint is not None
    restored = kc.restore(types.ModuleType("kernelns"), report.checkpoint)
    assert restored.consistency == "concurrent"
    assert kc.summary(restored).endswith(
        "; it was saved while code was running, so some values may be mid-update"
    )


def test_summary_sentences() -> None:
    checkpoint = kc.Checkpoint(
        id="00000001-20260101T000000000Z",
        path=Path("/checkpoints/k/00000001-20260101T000000000Z"),
        created=1_700_000_000.0,
        manifest={"bytes": 52_400_000},
    )
    sock = ("sock", "socket", "cannot pickle 'socket' object")
    saved = (("x", 28), ("weights", 52_428_800), ("alias", 52_428_800))
    save_report = kc.SaveReport(checkpoint, saved, (sock,), 52_400_000, 0.43, "consistent")
    assert kc.summary(save_report) == (
        "saved 3 variables (52.4 MB) in 0.4 s; not saved: sock (socket: cannot pickle 'socket' "
        "object)"
    )
    one = kc.SaveReport(checkpoint, (("x", 28),), (), 900, 0.01, "consistent")
    assert kc.summary(one) == "saved 1 variable (900 B) in 0.0 s"
    failed = kc.SaveReport(None, (), (sock,), 0, 1.26, "concurrent", error="OSError: disk full")
    assert kc.summary(failed) == (
        "checkpoint not saved after 1.3 s (OSError: disk full); any earlier one is kept; "
        "not saved: sock (socket: cannot pickle 'socket' object)"
    )
    restored = (*saved, ("y", 1), ("z", 2))
    for age, words in ((12.0, "12 s"), (180.0, "3 min"), (7200.0, "2 h"), (3 * 86400.0, "3 days")):
        report = kc.RestoreReport(checkpoint, restored, (sock,), age, "consistent")
        assert kc.summary(report) == (
            f"restored 5 variables (52.4 MB) from a checkpoint {words} old; "
            "not restored: sock (socket)"
        )


def test_torch_tensors_go_out_of_band_and_keep_aliasing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = make_module("""
        import torch
        weights = torch.arange(2**19, dtype=torch.float32)          # 2 MiB
        same = weights
        param = torch.nn.Parameter(torch.ones(1024, 512))            # 2 MiB
        view = torch.arange(2**21, dtype=torch.float32)[: 2**18]     # 1 MiB of an 8 MiB storage
        small = torch.ones(3)
        turned = torch.arange(2**20, dtype=torch.int64).reshape(2048, 512).T  # 8 MiB, strided
        half = torch.linspace(0, 1, 2**20, dtype=torch.bfloat16)     # 2 MiB
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path))
    assert report.checkpoint is not None, report.error
    tensors = [e for e in report.checkpoint.manifest["payload"] if e["kind"] == "tensor"]
    assert [(e["shape"], e["device"]) for e in tensors] == [
        ([2**19], "cpu"), ([1024, 512], "cpu"), ([2**18], "cpu"), ([512, 2048], "cpu"),
        ([2**20], "cpu"),
    ]  # fmt: skip
    assert tensors[2]["bytes"] < 2 * 2**20  # the view's elements, not its whole storage

    fresh = restore_fresh(report.checkpoint)
    assert fresh.same is fresh.weights
    assert torch.equal(fresh.weights, torch.arange(2**19, dtype=torch.float32))
    assert isinstance(fresh.param, torch.nn.Parameter) and fresh.param.requires_grad
    assert torch.equal(fresh.view, torch.arange(2**18, dtype=torch.float32))
    assert torch.equal(fresh.small, torch.ones(3))
    assert torch.equal(fresh.turned, module.turned) and fresh.turned.stride() == (1, 512)
    assert torch.equal(fresh.half, module.half) and fresh.half.dtype == torch.bfloat16
    # each tensor has memory of its own, as torch.load gives: writable, growable, not shared
    pointers = {t.untyped_storage().data_ptr() for t in (fresh.weights, fresh.turned, fresh.half)}
    assert len(pointers) == 3
    fresh.weights.resize_(2**20).fill_(7)
    assert fresh.weights.sum().item() == 7 * 2**20 and fresh.same is fresh.weights


def test_the_split_of_imported_names_is_dills_own(tmp_path: Path) -> None:
    """`snapshot._stash_modules` (on a module map of only what it looks up) splits a namespace
    into values and references exactly as `dill.session._stash_modules` (which maps every
    imported module) does."""
    import dill.session  # type: ignore[import-untyped]

    from kernel_queue.checkpoint import snapshot

    module = make_module("""
        import json, os.path, sys, collections.abc
        import numpy as np
        import numpy as numpy_again
        from numpy import array as make_array, float64
        from json import dumps
        from os.path import join as joined
        from collections import OrderedDict
        def helper(): return 1
        class Local: pass
        numbers, text, nothing, flag = [1, 2], "x", None, True
        maximum = sys.maxsize
        namespace = globals()
    """)
    ours, dills = snapshot._stash_modules(module), dill.session._stash_modules(module)
    assert ours is not module and list(vars(ours)) == list(vars(dills))
    for name, value in vars(dills).items():
        if name.startswith("__dill_"):
            assert vars(ours)[name] == value, name
        elif name == "namespace":
            assert vars(ours)[name] is vars(ours) and value is vars(dills)
        else:
            assert vars(ours)[name] is value, name
    assert {"make_array", "joined"} <= {name for *_, name in vars(ours)["__dill_imported_as"]}
    assert ("json", "dumps") in vars(ours)["__dill_imported"]
    plain = types.ModuleType("kernelns")
    plain.numbers = [1, 2]
    assert snapshot._stash_modules(plain) is plain is dill.session._stash_modules(plain)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_a_tensor_file_of_any_torch_save_layout_is_read_checked_and_built(
    tmp_path: Path, zip_format: bool
) -> None:
    """Files this code writes hold one storage in a zip and are read into the tensor's own
    memory; any other layout (here torch's legacy format) is read whole and `torch.load`ed."""
    torch = pytest.importorskip("torch")
    tensor = torch.arange(2**19, dtype=torch.float32).reshape(512, 1024)
    torch.save(tensor, tmp_path / "tensor-0001.pt", _use_new_zipfile_serialization=zip_format)
    data = (tmp_path / "tensor-0001.pt").read_bytes()
    record = {"bytes": len(data), "digest": digests.of_bytes(data)}
    entry = {"file": "tensor-0001.pt", "kind": "tensor"}

    read = payloads.read(tmp_path, entry, record)
    assert isinstance(read, payloads.TensorFile) == zip_format
    built = payloads.build(read, ("tensor", "tensor-0001.pt", "cpu", True, True))
    assert isinstance(built, torch.nn.Parameter) and built.requires_grad
    assert torch.equal(built.detach(), tensor)
    with pytest.raises(digests.Mismatch, match="does not match its digest"):
        payloads.read(tmp_path, entry, {**record, "digest": digests.of_bytes(b"other")})


def test_a_tensor_saved_on_a_device_this_machine_lacks_is_restored_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    module = make_module("""
        import torch
        weights = torch.arange(2**19, dtype=torch.float32)          # 2 MiB
        param = torch.nn.Parameter(torch.ones(1024, 512))            # 2 MiB
    """)
    written = payloads.OutOfBand.persistent_id

    def on_a_missing_gpu(self: payloads.OutOfBand, obj: Any) -> tuple[Any, ...] | None:
        """Record each tensor as saved from cuda:7, as a kernel on a GPU node would."""
        pid = written(self, obj)
        return (*pid[:2], "cuda:7", *pid[3:]) if pid and pid[0] == "tensor" else pid

    monkeypatch.setattr(payloads.OutOfBand, "persistent_id", on_a_missing_gpu)
    report = kc.save(module, kc.DirectoryStore(tmp_path))
    assert report.checkpoint is not None, report.error
    asked: list[str] = []

    def no_such_device(torch: Any, device: str) -> bool:
        asked.append(device)
        return False  # whatever accelerators the test machine has

    monkeypatch.setattr(payloads, "_device_available", no_such_device)
    fresh = restore_fresh(report.checkpoint)

    assert asked == ["cuda:7", "cuda:7"]
    assert fresh.weights.device.type == fresh.param.device.type == "cpu"
    assert torch.equal(fresh.weights, torch.arange(2**19, dtype=torch.float32))
    assert isinstance(fresh.param, torch.nn.Parameter) and fresh.param.requires_grad
    assert torch.equal(fresh.param.detach(), torch.ones(1024, 512))


def test_a_view_of_a_saved_array_comes_back_a_view_and_a_view_of_anything_else_a_copy(
    tmp_path: Path,
) -> None:
    module = make_module("""
        import numpy as np
        base = np.arange(2**20, dtype=np.float64)      # 8 MiB, its own file
        every_other = base[::2]
        reversed_tail = base[:-5:-1]
        head = np.arange(2**22, dtype=np.float64)[:10]  # the 32 MiB array behind it is no variable
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path))
    assert report.checkpoint is not None, report.error
    assert report.bytes < 9 * 2**20  # base once; not every_other again, nor head's 32 MiB

    fresh = restore_fresh(report.checkpoint)

    fresh.base[0] = -1.0
    assert fresh.every_other[0] == -1.0 and np.shares_memory(fresh.reversed_tail, fresh.base)
    assert np.array_equal(fresh.reversed_tail, np.arange(2**20 - 1, 2**20 - 5, -1))
    assert np.array_equal(fresh.head, np.arange(10)) and fresh.head.base is None


def test_small_arrays_are_packed_and_come_back_each_its_own_with_aliasing_kept(
    tmp_path: Path,
) -> None:
    module = make_module("""
        import numpy as np
        many = {f"a{i}": np.arange(i % 7, dtype=np.int16) + i for i in range(2000)}
        empty_a, empty_b = np.zeros(0), np.zeros(0)
        fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
        when = np.array(["2026-01-01T10:00"], dtype="datetime64[m]")
        text = np.array(["ab", "cde"])
        again = [fortran, fortran]
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path))
    assert report.checkpoint is not None, report.error
    [packed] = [e for e in report.checkpoint.manifest["payload"] if e["kind"] == "small-arrays"]
    assert packed["count"] == 2000 + 5

    fresh = restore_fresh(report.checkpoint)

    for key, value in module.many.items():
        restored = fresh.many[key]
        assert restored.dtype == np.int16 and np.array_equal(restored, value), key
    assert fresh.many["a3"].flags.owndata and fresh.many["a3"].flags.writeable
    assert fresh.empty_a is not fresh.empty_b
    assert fresh.fortran.flags.f_contiguous and np.array_equal(fresh.fortran, module.fortran)
    assert fresh.again[0] is fresh.again[1] is fresh.fortran
    assert fresh.when[0] == np.datetime64("2026-01-01T10:00") and list(fresh.text) == ["ab", "cde"]


def test_a_module_held_inside_a_value_comes_back_as_the_live_module_not_an_old_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    importable(tmp_path, monkeypatch, "kq_live_mod", "counter = 1\n")
    module = make_module("""
        import kq_live_mod
        holder = {"mod": kq_live_mod}
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path / "store"))
    assert report.checkpoint is not None, report.error
    live = sys.modules["kq_live_mod"]
    live.counter = 5  # the library moved on after the save

    fresh = restore_fresh(report.checkpoint)

    assert fresh.holder["mod"] is live
    assert live.counter == 5  # dill's by-value copy of the module used to set it back to 1
    monkeypatch.delitem(sys.modules, "kq_live_mod")


class MutatingStore(DelegatingStore):
    """A DirectoryStore whose payload files let `change()` run right after each big write, as a
    thread changing an array during a concurrent save would."""

    def __init__(self, store: kc.DirectoryStore, change: Any) -> None:
        super().__init__(store)
        self.change = change

    def open(self, name: str) -> BinaryIO:
        file = super().open(name)
        write = file.write

        def write_then_change(data: Any) -> int:
            written = write(data)
            if memoryview(data).nbytes >= 2**20:
                self.change()
            return written

        file.write = write_then_change  # type: ignore[method-assign]
        return file


def test_an_array_changed_while_it_is_written_leaves_a_checkpoint_that_restores(
    tmp_path: Path,
) -> None:
    module = make_module("import numpy as np\nbig = np.zeros(48 * 2**20, dtype=np.uint8)")

    def change() -> None:
        module.big[-(2**24) :] += 1  # its last 16 MiB, right after the write reached the file

    store = kc.DirectoryStore(tmp_path)
    report = kc.save(module, MutatingStore(store, change), consistency="concurrent")
    assert report.checkpoint is not None, report.error

    fresh = types.ModuleType("kernelns")
    recovery = kc.recover(fresh, store)

    assert recovery.problems == () and recovery.report is not None
    assert int(fresh.big[0]) == 0 and int(fresh.big[-1]) == 0  # as written: one 48 MiB chunk


def test_plain_values_with_cycles_and_sharing_are_saved_and_keep_their_shape(
    tmp_path: Path,
) -> None:
    module = make_module("""
        history = [float(i) for i in range(10_000)]
        loop = []
        loop.append(loop)
        shared = {"a": 1}
        twice = [shared, shared, ("t", b"b", None, 1j)]
    """)
    report = kc.save(module, kc.DirectoryStore(tmp_path))
    assert report.checkpoint is not None and report.skipped == ()
    assert [name for name, _ in report.saved] == ["history", "loop", "shared", "twice"]

    fresh = restore_fresh(report.checkpoint)
    assert fresh.history == module.history and fresh.loop[0] is fresh.loop
    assert fresh.twice[0] is fresh.twice[1] is fresh.shared


def test_a_list_of_numbers_is_pickled_by_the_c_pickler_and_keeps_its_sharing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from kernel_queue.checkpoint import snapshot

    module = make_module("""
        history = [float(i) for i in range(10_000)] + [None, True, 2**70, -3]
        same = history
        nested = {"h": history, "few": [1.0, 2.0]}
        mixed = [1.0] * 100 + ["text"]
    """)
    dumped: list[int] = []

    class Recording(pickle.Pickler):
        def dump(self, obj: Any) -> None:
            dumped.append(len(obj))
            super().dump(obj)

    monkeypatch.setattr(snapshot, "pickle", types.SimpleNamespace(Pickler=Recording))
    report = kc.save(module, kc.DirectoryStore(tmp_path))

    assert report.checkpoint is not None
    assert len(module.history) in dumped and 101 not in dumped and 2 not in dumped
    assert len(module.history) >= snapshot.NUMBER_LIST
    fresh = restore_fresh(report.checkpoint)
    assert fresh.history == module.history and fresh.mixed == module.mixed
    assert fresh.same is fresh.history is fresh.nested["h"]
    assert type(fresh.history[-2]) is int and fresh.history[-4:-2] == [None, True]
