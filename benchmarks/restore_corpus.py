"""The restore corpus: values people hold in notebooks, saved and restored through a checkpoint.

Each case is restored exactly (its fingerprint, taken before the save and after the restore in
two fresh processes whose `__main__` plays the kernel's namespace, is equal, and its identity
checks hold), or skipped with its name and reason; anything else is wrong. Prints
"restored exactly N / skipped with reason N / wrong N (must be 0) out of N".
Usage: python benchmarks/restore_corpus.py [--dir D]
(tests/checkpoint/test_restore_corpus.py runs it too)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HAS_TORCH = importlib.util.find_spec("torch") is not None


@dataclass(frozen=True)
class Case:
    """One value (or a few names that belong together) of the corpus."""

    name: str
    names: tuple[str, ...]
    """The variables it defines; all must be restored (or all skipped, with a reason)."""
    fingerprint: str = ""
    """An expression whose value must be equal before the save and after the restore."""
    checks: tuple[str, ...] = ()
    """Expressions that must be true after the restore (identity, behaviour)."""
    needs_torch: bool = False


CELLS = """
import dataclasses, functools, io, socket, threading
import numpy as np
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
rng = np.random.default_rng(0)

df_categorical = pd.DataFrame({
    "colour": pd.Categorical(["red", "green", "red", "blue"], categories=["red", "green", "blue"],
                             ordered=True),
    "n": [1, 2, 3, 4],
})
df_tz = pd.DataFrame(
    {"when": pd.date_range("2026-01-01", periods=5, freq="h", tz="Europe/Paris"),
     "value": np.arange(5.0)},
    index=pd.DatetimeIndex(pd.date_range("2026-03-29", periods=5, freq="30min", tz="UTC")),
)
df_multi = pd.DataFrame(
    rng.random((6, 4)),
    index=pd.MultiIndex.from_product([["a", "b"], [1, 2, 3]], names=["letter", "number"]),
    columns=pd.MultiIndex.from_tuples([("x", "mean"), ("x", "std"), ("y", "mean"), ("y", "std")]),
)
df_big = pd.DataFrame(rng.random((200_000, 4)), columns=list("abcd"))  # 6.4 MB of blocks
series = pd.Series([1.5, None, 3.0], index=["p", "q", "r"], name="s")

base = np.arange(4_000_000, dtype=np.float64)   # 32 MB: out of band
view = base[1::2]                                # a view: must still share base's memory
small_base = np.arange(100)
small_view = small_base[::-3]
records = np.zeros(50_000, dtype=[("id", "<i4"), ("score", "<f8"), ("tag", "S5")])
records["id"] = np.arange(50_000)
objects = np.array([{"k": i} for i in range(1000)] + [None, "text", 3.5], dtype=object)
fortran = np.asfortranarray(rng.random((600, 400)))
big_endian = np.arange(300_000, dtype=">i8")
memmap = np.memmap(MEMMAP_PATH, dtype=np.int32, mode="w+", shape=(1024, 512))
memmap[:] = np.arange(1024 * 512, dtype=np.int32).reshape(1024, 512)
memmap.flush()

X = rng.normal(size=(200, 4))
y = (X[:, 0] + X[:, 1] > 0).astype(int)
classifier = LogisticRegression().fit(X, y)
pipeline = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)

figure, axes = plt.subplots(figsize=(3, 2), dpi=50)
axes.plot([0, 1, 2], [2, 0, 1], label="line")
axes.set_title("corpus")
axes.legend()

@dataclasses.dataclass
class Point:
    x: float
    y: float = 0.0
    tags: list = dataclasses.field(default_factory=list)
    def norm2(self):
        return self.x ** 2 + self.y ** 2

@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    size: int

point = Point(3.0, 4.0, ["a"])
frozen = Frozen("f", 2)

def make_counter(start):
    count = start
    def counter():
        nonlocal count
        count += 1
        return count
    return counter
counter = make_counter(10)
counter()
square = lambda v: v * v
partial_pow = functools.partial(pow, 2)

FACTOR = 3
def scaled(v):
    return v * FACTOR
class Accumulator:
    unit = 1
    def __init__(self):
        self.total = 0
    def add(self, v):
        self.total += v * FACTOR * self.unit
        return self.total
accumulator = Accumulator()
accumulator.add(2)

shared = [1, 2, 3]
holder = {"list": shared, "again": shared}
nested = [shared, holder, (shared,)]
loop = []
loop.append(loop)

many_small = {f"a{i}": np.arange(i % 50, dtype=np.int32) + i for i in range(10_000)}

generator = (i * i for i in range(10))
open_for_writing = open(WRITE_PATH, "w")
open_for_writing.write("written before the save\\n")
open_for_writing.flush()
open_for_reading = open(READ_PATH)
open_for_reading.readline()
files_in_a_dict = {"log": open_for_writing}
sock = socket.socket()
lock = threading.Lock()
buffer = io.BytesIO(b"in memory")
"""

TORCH_CELLS = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
loss = model(torch.ones(3, 4)).sum()
loss.backward()
optimizer.step()
loss = float(loss)
leaf = torch.arange(6.0).requires_grad_(True)
big_leaf = torch.ones(512, 1024).requires_grad_(True)   # 2 MiB: out of band
parameter = torch.nn.Parameter(torch.full((3,), 0.5))
non_leaf = leaf * 2
half = torch.arange(4, dtype=torch.bfloat16)
"""

CASES = [
    Case("pandas-categorical", ("df_categorical",), "frame(df_categorical)"),
    Case("pandas-tz-datetime", ("df_tz",), "frame(df_tz)"),
    Case("pandas-multiindex", ("df_multi",), "frame(df_multi)"),
    Case("pandas-big-frame", ("df_big",), "frame(df_big)"),
    Case("pandas-series", ("series",), "frame(series)"),
    Case(
        "numpy-view",
        ("base", "view"),
        "array(base) + array(view)",
        ("np.shares_memory(view, base)", "view.base is not None"),
    ),
    Case(
        "numpy-small-view",
        ("small_base", "small_view"),
        "array(small_base) + array(small_view)",
        ("np.shares_memory(small_view, small_base)",),
    ),
    Case("numpy-structured", ("records",), "array(records)"),
    Case("numpy-object", ("objects",), "repr(objects.tolist())"),
    Case("numpy-fortran", ("fortran",), "array(fortran)", ("fortran.flags.f_contiguous",)),
    Case("numpy-big-endian", ("big_endian",), "array(big_endian)"),
    Case("numpy-memmap", ("memmap",), "array(memmap)"),
    Case(
        "sklearn-estimator",
        ("classifier",),
        "array(classifier.coef_) + array(classifier.predict_proba(X))",
    ),
    Case("sklearn-pipeline", ("pipeline",), "array(pipeline.predict_proba(X))"),
    Case("matplotlib-figure", ("figure", "axes"), "picture(figure)", ("axes.figure is figure",)),
    Case(
        "dataclasses",
        ("Point", "point", "Frozen", "frozen"),
        "repr(point) + repr(frozen)",
        (
            "type(point) is Point",
            "point == Point(3.0, 4.0, ['a'])",
            "hash(frozen) == hash(Frozen('f', 2))",
        ),
    ),
    Case("closure", ("make_counter", "counter"), "", ("counter() == 12", "make_counter(0)() == 1")),
    Case("lambda-and-partial", ("square", "partial_pow"), "square(7) + partial_pow(5)"),
    Case(
        "functions-using-globals",
        ("FACTOR", "scaled", "Accumulator", "accumulator"),
        "scaled(2) + accumulator.total",
        (
            "scaled.__globals__ is globals()",
            "isinstance(accumulator, Accumulator)",
            "accumulator.add(1) == 9",
            "rebind('FACTOR', 10) or scaled(2) == 20",
        ),
    ),
    Case(
        "nested-aliasing",
        ("shared", "holder", "nested", "loop"),
        "repr(nested)",
        (
            "holder['list'] is shared and holder['again'] is shared",
            "nested[0] is shared and nested[1] is holder and nested[2][0] is shared",
            "loop[0] is loop",
        ),
    ),
    Case(
        "dict-of-10000-small-arrays",
        ("many_small",),
        "digest(b''.join(v.tobytes() for v in many_small.values()))",
        ("len(many_small) == 10_000", "many_small['a9999'].dtype == np.int32"),
    ),
    Case("generator", ("generator",)),
    Case("open-file-for-writing", ("open_for_writing",)),
    Case("open-file-for-reading", ("open_for_reading",)),
    Case("open-file-in-a-dict", ("files_in_a_dict",)),
    Case("socket", ("sock",)),
    Case("lock", ("lock",), "", ("lock.acquire(blocking=False)",)),
    Case("bytes-io", ("buffer",), "buffer.getvalue()", ("buffer.read() == b'in memory'",)),
    Case(
        "torch-module-and-optimizer",
        ("model", "optimizer", "loss"),
        "tensors(model(torch.ones(3, 4))) + tensors(optimizer.state_dict()) + repr(loss)",
        (
            "optimizer.param_groups[0]['params'][0] is model[0].weight",
            "all(p.requires_grad for p in model.parameters())",
        ),
        needs_torch=True,
    ),
    Case(
        "torch-requires-grad",
        ("leaf", "big_leaf", "parameter"),
        "tensors(leaf) + tensors(big_leaf) + tensors(parameter)",
        (
            "leaf.requires_grad and leaf.is_leaf and big_leaf.requires_grad",
            "isinstance(parameter, torch.nn.Parameter) and parameter.requires_grad",
        ),
        needs_torch=True,
    ),
    Case("torch-non-leaf", ("non_leaf",), needs_torch=True),
    Case("torch-bfloat16", ("half",), "tensors(half)", ("half.dtype == torch.bfloat16",), True),
]
"""Every case; a case with neither fingerprint nor checks is expected to be skipped."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def array(value: Any) -> str:
    """dtype, shape, strides' order and bytes of an array (a memmap as its data)."""
    import numpy as np

    value = np.asarray(value)
    layout = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
    return f"{value.dtype.str}{value.shape}{layout}:{digest(np.ascontiguousarray(value).tobytes())}"


def frame(value: Any) -> str:
    """A pandas object's dtypes, index, columns and a hash of every row with its index."""
    import pandas as pd

    parts = [repr(value.dtypes), repr(value.index), repr(getattr(value, "columns", None))]
    parts.append(array(pd.util.hash_pandas_object(value, index=True).to_numpy()))
    return digest("\n".join(parts).encode())


def picture(figure: Any) -> str:
    """The figure as rendered by Agg (RGBA bytes)."""
    figure.canvas.draw()
    return digest(bytes(figure.canvas.buffer_rgba()))


def tensors(value: Any) -> str:
    import torch

    found: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            data = item.detach().cpu()
            raw = data.view(torch.uint8) if data.dim() else data.reshape(1).view(torch.uint8)
            found.append(f"{data.dtype}{tuple(data.shape)}:{digest(raw.numpy().tobytes())}")
        elif isinstance(item, dict):
            for key in sorted(item, key=repr):
                found.append(repr(key))
                walk(item[key])
        elif isinstance(item, list | tuple):
            for element in item:
                walk(element)
        else:
            found.append(repr(item))

    walk(value)
    return digest("|".join(found).encode())


HELPERS = {"digest": digest, "array": array, "frame": frame, "picture": picture, "tensors": tensors}


def before(main: types.ModuleType, store: str, out: str) -> None:
    """Phase 1, in a fresh process: the cells ran in `main`; take fingerprints and save."""
    import kernel_queue.checkpoint as kc

    prints = {case.name: _fingerprint(case, main) for case in _cases() if case.fingerprint}
    report = kc.save(main, kc.DirectoryStore(store, secret=_SECRET))
    Path(out).write_text(
        json.dumps(
            {
                "fingerprints": prints,
                "error": report.error,
                "skipped": [list(item) for item in report.skipped],
                "summary": kc.summary(report),
            }
        )
    )


def after(main: types.ModuleType, store: str, before_file: str, out: str) -> None:
    """Phase 2, in another fresh process: restore into `main` and judge every case."""
    import kernel_queue.checkpoint as kc

    recovery = kc.recover(main, kc.DirectoryStore(store, secret=_SECRET))
    saved = json.loads(Path(before_file).read_text())
    results: dict[str, list[str]] = {}
    report = recovery.report
    skipped = {name: reason for name, _, reason in report.skipped} if report else {}
    for case in CASES:
        if case.needs_torch and not HAS_TORCH:
            results[case.name] = ["skipped", "torch is not installed"]
        elif report is None:
            results[case.name] = ["wrong", f"nothing restored: {kc.summary(recovery)}"]
        else:
            results[case.name] = _judge(case, main, saved["fingerprints"], skipped)
    Path(out).write_text(json.dumps({"results": results, "summary": kc.summary(recovery)}))


def run(directory: Path) -> dict[str, Any]:
    """Both phases in fresh processes under `directory`; the results and both summaries."""
    store, first, second = directory / "store", directory / "before.json", directory / "after.json"
    paths = {
        "MEMMAP_PATH": str(directory / "data.mm"),
        "WRITE_PATH": str(directory / "written.txt"),
        "READ_PATH": str(directory / "read.txt"),
    }
    (directory / "read.txt").write_text("first line\nsecond line\n")
    cells = CELLS + (TORCH_CELLS if HAS_TORCH else "")
    prologue = f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport restore_corpus as _harness\n"
    prologue += "".join(f"{name} = {value!r}\n" for name, value in paths.items())
    _run_script(
        directory / "before.py",
        prologue + cells + f"\n_harness.before(sys.modules['__main__'], {str(store)!r}, "
        f"{str(first)!r})\n",
    )
    written = Path(paths["WRITE_PATH"]).read_text()
    _run_script(
        directory / "after.py",
        prologue + f"_harness.after(sys.modules['__main__'], {str(store)!r}, {str(first)!r}, "
        f"{str(second)!r})\n",
    )
    outcome = json.loads(second.read_text())
    outcome["before"] = json.loads(first.read_text())
    # a file the user had open must be left as it was, not truncated by a reopen
    outcome["written file kept"] = Path(paths["WRITE_PATH"]).read_text() == written
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to work (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kq-corpus-", dir=args.dir) as directory:
        outcome = run(Path(directory))
    results = outcome["results"]
    for name, (verdict, detail) in results.items():
        print(f"  {verdict:<8} {name}" + (f": {detail}" if detail else ""))
    counts = {
        v: sum(1 for r in results.values() if r[0] == v) for v in ("exact", "skipped", "wrong")
    }
    if not outcome["written file kept"]:
        counts["wrong"] += 1
        print("  wrong    a file open for writing was truncated by the restore")
    print(f"save:    {outcome['before']['summary']}")
    print(f"restore: {outcome['summary']}")
    print(
        f"restored exactly {counts['exact']} / skipped with reason {counts['skipped']} / "
        f"wrong {counts['wrong']} (must be 0) out of {len(results)}"
    )
    sys.exit(1 if counts["wrong"] else 0)


_SECRET = b"restore corpus"  # any secret: both phases are one kernel


def _cases() -> list[Case]:
    return [case for case in CASES if HAS_TORCH or not case.needs_torch]


def _fingerprint(case: Case, main: types.ModuleType) -> str:
    return str(eval(case.fingerprint, vars(main), dict(HELPERS)))


def _judge(
    case: Case, main: types.ModuleType, fingerprints: dict[str, str], skipped: dict[str, str]
) -> list[str]:
    """["exact" | "skipped" | "wrong", detail] for one case after the restore."""
    namespace = vars(main)
    reasons = [f"{name}: {skipped[name]}" for name in case.names if name in skipped]
    missing = [name for name in case.names if name not in namespace and name not in skipped]
    expected_skip = not case.fingerprint and not case.checks
    if reasons and len(reasons) == len(case.names):
        return ["skipped", "; ".join(reasons)]
    if reasons or missing:
        return ["wrong", f"partly restored: skipped {reasons}, silently missing {missing}"]
    if expected_skip:
        return ["wrong", "restored, but it cannot be restored faithfully: it must be skipped"]
    helpers = {**HELPERS, "rebind": lambda k, v: namespace.__setitem__(k, v)}
    try:
        if case.fingerprint:
            found = str(eval(case.fingerprint, namespace, helpers))
            if found != fingerprints[case.name]:
                return ["wrong", "restored with different values"]
        for check in case.checks:
            if not eval(check, namespace, helpers):
                return ["wrong", f"restored, but not: {check}"]
    except Exception as exc:
        return ["wrong", f"restored, but {type(exc).__name__}: {exc}"]
    return ["exact", ""]


def _run_script(path: Path, source: str) -> None:
    path.write_text(textwrap.dedent(source))
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=600, cwd=path.parent
    )
    if done.returncode != 0:
        raise RuntimeError(f"{path.name} failed:\n{done.stderr[-4000:]}")


if __name__ == "__main__":
    main()
