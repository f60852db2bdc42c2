"""Checkpoint flush and restore speed for an array-heavy namespace, against plain baselines.

Prints the median of `--runs` of: our `save` (fsync included) vs `np.save`+fsync of the same
arrays (target ratio >= 0.8) and vs `dill.dump_module`+fsync (target >= 2), and our `restore` vs
`np.load` (target >= 0.8) (DESIGN.md "checkpoint flush"). Reads come from the page cache; the
order of the contenders alternates between runs.
Usage: python benchmarks/checkpoint_speed.py [--size-mb 1024] [--arrays 4] [--runs 3] [--dir D]
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
    module.square = lambda x: x * x
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


def ours_save(module: types.ModuleType, directory: Path) -> None:
    report = kc.save(module, kc.DirectoryStore(directory))
    if report.checkpoint is None:
        raise SystemExit(f"save failed: {report.error}")


def numpy_load(directory: Path) -> None:
    # keep every array until all are loaded, as a restore does (fresh pages, not reused ones)
    loaded = [np.load(path) for path in sorted(directory.glob("*.npy"))]
    del loaded


def ours_restore(directory: Path) -> None:
    checkpoint = kc.DirectoryStore(directory).latest()
    assert checkpoint is not None
    kc.restore(types.ModuleType("bench"), checkpoint)


def timed(action: Callable[..., None], *args: Any) -> float:
    started = time.perf_counter()
    action(*args)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB of arrays (256: quick)")
    parser.add_argument("--arrays", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    module = namespace(args.size_mb, args.arrays)
    total = sum(a.nbytes for a in arrays_of(module).values())
    base = Path(tempfile.mkdtemp(prefix="kq-ckpt-bench-", dir=args.dir))
    print(f"{args.arrays} float64 arrays, {total / 1e9:.2f} GB in all, + small objects; in {base}")
    times: dict[str, list[float]] = {
        "ours": [],
        "np.save": [],
        "dill": [],
        "restore": [],
        "np.load": [],
    }
    try:
        for run in range(args.runs):
            ours, plain, session = base / f"ours-{run}", base / f"np-{run}", base / f"dill-{run}"
            steps = [
                ("ours", ours_save, (module, ours)),
                ("np.save", numpy_save, (module, plain)),
                ("dill", dill_dump, (module, session)),
            ]
            reads = [("restore", ours_restore, (ours,)), ("np.load", numpy_load, (plain,))]
            if run % 2:  # alternate the order so that neither side always goes first
                steps.reverse()
                reads.reverse()
            for name, action, arguments in steps + reads:
                times[name].append(timed(action, *arguments))
            for directory in (ours, plain, session):
                shutil.rmtree(directory)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    median = {name: statistics.median(values) for name, values in times.items()}
    speed = {name: total / seconds / 1e9 for name, seconds in median.items()}

    def line(name: str, label: str) -> None:
        print(f"  {label:<28} {median[name]:6.2f} s  {speed[name]:5.2f} GB/s")

    print(f"median of {args.runs}:")
    line("ours", "save (ours, fsync)")
    line("np.save", "np.save + fsync")
    line("dill", "dill.dump_module + fsync")
    line("restore", "restore (ours)")
    line("np.load", "np.load")
    print(f"save vs np.save:          {speed['ours'] / speed['np.save']:.2f}x (target >= 0.8)")
    print(f"save vs dill.dump_module: {speed['ours'] / speed['dill']:.2f}x (target >= 2)")
    print(f"restore vs np.load:       {speed['restore'] / speed['np.load']:.2f}x (target >= 0.8)")


if __name__ == "__main__":
    main()
