"""Checkpoint flush and restore speed for an array-heavy namespace, against plain baselines.

Prints the median of `--runs` of: our `save` (fsync, digests and signature included) vs
`np.save`+fsync of the same arrays (target ratio >= 1.0) and vs `dill.dump_module`+fsync
(target >= 2), and our restore (`recover`: every digest checked) vs `np.load` (target >= 1.2)
(the project's "checkpoint flush" targets); then a dict of 10,000 small arrays against dill
both ways; then continuous checkpoints (`continuous_speed.py`, real launchers and kernels): the
SIGTERM flush of a 2 GiB namespace whose last cell changed 10 MiB against a full save (target
<= 10%), once the cell's checkpoint committed and with it still in flight, and the per-cell cost
of 1 s cells with continuous checkpoints against checkpoints off (target <= +5%).
Reads come from the page cache unless `--cold` evicts the files first; the order of the
contenders alternates between runs.
Usage: python benchmarks/checkpoint_speed.py [--size-mb 1024] [--arrays 4] [--runs 3] [--dir D]
       [--cold] [--cells 15 | --cells 0 (no continuous part)]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import continuous_speed  # this folder's: python benchmarks/checkpoint_speed.py
import dill  # type: ignore[import-untyped]
import numpy as np

import kernel_queue.checkpoint as kc


def namespace(size_mb: int, arrays: int) -> types.ModuleType:
    """A few float64 arrays of `size_mb` MiB in all, plus the small things a notebook holds."""
    module = types.ModuleType("bench")
    rng = np.random.default_rng(0)
    per_array = size_mb * 2**20 // 8 // arrays
    for index in range(arrays):
        setattr(module, f"array_{index}", rng.random(per_array))
    module.config = {"lr": 3e-4, "epochs": 10, "layers": [512, 256, 10]}
    module.history = [float(x) for x in range(10_000)]
    module.labels = np.arange(1000)
    exec("square = lambda x: x * x", vars(module))  # a lambda defined in the namespace
    return module


def arrays_of(module: types.ModuleType) -> dict[str, np.ndarray]:
    return {k: v for k, v in vars(module).items() if k.startswith("array_")}


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def numpy_save(module: types.ModuleType, directory: Path) -> None:
    directory.mkdir()
    for name, array in arrays_of(module).items():
        with open(directory / f"{name}.npy", "wb") as file:
            np.save(file, array)
            file.flush()
            os.fsync(file.fileno())
    fsync_path(directory)


def dill_dump(module: types.ModuleType, directory: Path) -> None:
    directory.mkdir()
    with open(directory / "session.pkl", "wb") as file:
        dill.dump_module(file, module=module, refimported=True)
        file.flush()
        os.fsync(file.fileno())
    fsync_path(directory)


SECRET = kc.derive_secret(b"benchmark connection key")
COLD = False
"""Set by --cold: every file a read step reads is evicted from the page cache first."""


def evict(directory: Path) -> None:
    """Drop `directory`'s files from the page cache (they are fsynced, so clean)."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def ours_save(module: types.ModuleType, directory: Path) -> None:
    report = kc.save(module, kc.DirectoryStore(directory, secret=SECRET))
    if report.checkpoint is None:
        raise SystemExit(f"save failed: {report.error}")


def numpy_load(directory: Path) -> None:
    # keep every array until all are loaded, as a restore does (fresh pages, not reused ones)
    loaded = [np.load(path) for path in sorted(directory.glob("*.npy"))]
    del loaded


def ours_restore(directory: Path) -> None:
    recovery = kc.recover(types.ModuleType("bench"), kc.DirectoryStore(directory, secret=SECRET))
    if recovery.report is None:
        raise SystemExit(f"restore failed: {kc.summary(recovery)}")


def dill_load(directory: Path) -> None:
    dill.load_module(str(directory / "session.pkl"), module=types.ModuleType("bench"))


def timed(action: Callable[..., None], *args: Any) -> float:
    if COLD and action in (numpy_load, ours_restore, dill_load):
        evict(args[0])
    started = time.perf_counter()
    action(*args)
    return time.perf_counter() - started


def small_arrays() -> types.ModuleType:
    """dill's weak spot: a dict of 10,000 small arrays (16 float64 each)."""
    module = types.ModuleType("bench")
    rng = np.random.default_rng(1)
    module.many = {f"a{index}": rng.random(16) for index in range(10_000)}
    return module


def race(
    base: Path, runs: int, saves: list[tuple[str, Any, Any]], reads: list[tuple[str, Any, str]]
) -> dict[str, float]:
    """Median seconds of each save (module, directory maker) and read (of a save's directory)."""
    times: dict[str, list[float]] = {name: [] for name, _, _ in saves + reads}
    for run in range(runs):
        directories = {name: base / f"{name.replace(' ', '-')}-{run}" for name, _, _ in saves}
        steps = [(name, action, (module, directories[name])) for name, action, module in saves]
        loads = [(name, action, (directories[of],)) for name, action, of in reads]
        if run % 2:  # alternate the order so that neither side always goes first
            steps.reverse()
            loads.reverse()
        for name, action, arguments in steps + loads:
            times[name].append(timed(action, *arguments))
        for directory in directories.values():
            shutil.rmtree(directory)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    global COLD
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB of arrays (256: quick)")
    parser.add_argument("--arrays", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--cold", action="store_true", help="read from disk, not the page cache")
    parser.add_argument(
        "--cells", type=int, default=15, help="1 s cells per kernel of the per-cell cost (0: skip)"
    )
    args = parser.parse_args()
    COLD = args.cold

    module = namespace(args.size_mb, args.arrays)
    total = sum(a.nbytes for a in arrays_of(module).values())
    base = Path(tempfile.mkdtemp(prefix="kq-ckpt-bench-", dir=args.dir))
    where = "from disk (evicted first)" if COLD else "from the page cache"
    print(f"{args.arrays} float64 arrays, {total / 1e9:.2f} GB in all, + small objects; in {base}")
    print(f"digests and signature on; reads {where}")
    try:
        median = race(
            base,
            args.runs,
            [
                ("ours", ours_save, module),
                ("np.save", numpy_save, module),
                ("dill", dill_dump, module),
            ],
            [("restore", ours_restore, "ours"), ("np.load", numpy_load, "np.save")],
        )
        small = small_arrays()
        few = race(
            base,
            args.runs,
            [("ours", ours_save, small), ("dill", dill_dump, small)],
            [("restore", ours_restore, "ours"), ("dill.load", dill_load, "dill")],
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    speed = {name: total / seconds / 1e9 for name, seconds in median.items()}

    def line(name: str, label: str) -> None:
        print(f"  {label:<28} {median[name]:6.2f} s  {speed[name]:5.2f} GB/s")

    print(f"median of {args.runs}:")
    line("ours", "save (ours, fsync)")
    line("np.save", "np.save + fsync")
    line("dill", "dill.dump_module + fsync")
    line("restore", "restore (ours, verified)")
    line("np.load", "np.load")
    print(f"save vs np.save:          {speed['ours'] / speed['np.save']:.2f}x (target >= 1.0)")
    print(f"save vs dill.dump_module: {speed['ours'] / speed['dill']:.2f}x (target >= 2)")
    print(f"restore vs np.load:       {speed['restore'] / speed['np.load']:.2f}x (target >= 1.2)")
    print("a dict of 10,000 small arrays:")
    print(
        f"  save (ours) {few['ours']:.3f} s, dill.dump_module {few['dill']:.3f} s: "
        f"{few['dill'] / few['ours']:.2f}x"
    )
    print(
        f"  restore (ours) {few['restore']:.3f} s, dill.load_module {few['dill.load']:.3f} s: "
        f"{few['dill.load'] / few['restore']:.2f}x"
    )
    if args.cells:
        continuous_speed.report(max(3, args.runs), args.cells, args.dir)


if __name__ == "__main__":
    main()
