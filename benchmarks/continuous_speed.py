"""Continuous checkpoints, measured on real launchers and kernels, each case beside its baseline.

Every case is repeated (`--repeat`, at least 3) and printed as min / median / max; each ratio is
taken within one repeat, between runs made side by side in the same cache state, so the
machine's load at that moment falls on both sides of it. Two cache states: `cold`, the page
cache of the kernel's checkpoint files dropped first (fsync, then
`posix_fadvise(POSIX_FADV_DONTNEED)` on each file: per file, so nobody else's cache on a shared
machine is touched), and `warm`, every checkpoint file read into the page cache first.

`flush`: a 2 GiB namespace (8 float64 arrays of 256 MiB, a 10 MiB array, a list) whose last cell
changed the 10 MiB array. The SIGTERM flush (the kernel's own report: the save in flight it
waited for, then its own, both printed) divided by what a user would otherwise wait, the SIGTERM
save of the same namespace by a kernel without continuous checkpoints, in the same repeat and
cache state (target: <= 10% in every case), for SIGTERM once the last cell's background
checkpoint committed and SIGTERM right after the cell's reply (its save still in flight).
SIGTERM to the launcher's exit is printed beside, against the full save's (no target: it adds
the kernel's fixed ~0.2 s of leaving). The cache is set up just before SIGTERM (in flight: before
the last cell, which SIGTERM follows at once).
`per cell`: 1 s cells of CPU work (a Python loop; each cell also changes 1 MiB of a 48 MiB array)
in a 202 MiB namespace, in one kernel, continuous checkpoints on against paused (its own switch,
set by a silent request): blocks of 3 cells back to back (as "run all" does: each save overlaps
the next cell), the blocks alternating between the two states, the last save ended before a
paused block; per repeat and cache state the median of the ratios of each on cell to its pair in
the adjacent paused block (target: on/off <= +5%), the saves' seconds and what the reply waited
for (page scan and fork), and the same ratio of the cell thread's own CPU time. One kernel and
pairs a few seconds apart, because this shared two-core VM's speed drifts by 15-20% within a
minute and two kernels running the same cells differ by up to 20% (seen with both off). Cold
drops the kernel's checkpoint files before each cell.

Figures are printed beside their targets, never asserted.
Usage: python benchmarks/continuous_speed.py [--repeat 3] [--cells 30] [--only flush|cell]
       [--dir D]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient

import kernel_queue.checkpoint as kc
from kernel_queue.launcher import contract

REPO = Path(__file__).resolve().parents[1]
KEY = "benchmark-key"
WAIT = 300.0
MIB = 2**20
CACHES = ("cold", "warm")
FLUSH_TARGET, CELL_TARGET = 0.10, 0.05


class Kernel:
    """One launcher and its kernel, driven as a notebook would; its store and status events."""

    def __init__(self, base: Path, name: str, *, checkpoints: bool, continuous: bool) -> None:
        self.store = base / name / "store"
        self.store.parent.mkdir(parents=True)
        ports = _free_ports()
        read_fd, write_fd = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERNEL_QUEUE")}
        env.update(PYTHONPATH=str(REPO), TMPDIR=str(self.store.parent))
        env[contract.ENV_PORTS] = ",".join(map(str, ports))
        env[contract.ENV_KEY] = KEY
        env[contract.ENV_STATUS_FD] = str(write_fd)
        env[contract.ENV_STOP_TIMEOUT] = "120"
        if checkpoints:
            env[contract.ENV_CHECKPOINT_DIR] = str(self.store)
            env[contract.ENV_CHECKPOINT_DEADLINE] = "110"
            env[contract.ENV_CHECKPOINT_CONTINUOUS] = "1" if continuous else "0"
        self.log = self.store.parent / "launcher.log"
        log = open(self.log, "wb")  # noqa: SIM115 - closed below, the launcher keeps its copy
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_queue.launcher"],
            env=env,
            pass_fds=[write_fd],
            stdout=log,
            stderr=log,
        )
        log.close()
        os.close(write_fd)
        self.status_fd = read_fd
        names = ["shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"]
        info: dict[str, Any] = dict(zip(names, ports, strict=True))
        info.update(ip="127.0.0.1", key=KEY, transport="tcp", signature_scheme="hmac-sha256")
        self.client = BlockingKernelClient()
        self.client.load_connection_info(info)
        self.client.start_channels(stdin=False, hb=False)
        self.client.wait_for_ready(timeout=WAIT)
        self.count = 0
        """The last cell's number."""

    def run(self, code: str) -> float:
        """Run a cell; the seconds from the request to its reply (what the user waits). What
        it printed is `printed`."""
        printed: list[str] = []

        def output(message: dict[str, Any]) -> None:
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])

        started = time.perf_counter()
        reply = self.client.execute_interactive(code, timeout=WAIT, output_hook=output)
        seconds = time.perf_counter() - started
        if reply["content"]["status"] != "ok":
            raise SystemExit(f"cell failed: {reply['content']}")
        self.count = int(reply["content"]["execution_count"])
        self.printed = "".join(printed)
        return seconds

    def silent(self, code: str) -> None:
        """Run `code` as a silent request (no cell number, no cell events)."""
        reply = self.client.execute_interactive(code, silent=True, timeout=WAIT)
        if reply["content"]["status"] != "ok":
            raise SystemExit(f"request failed: {reply['content']}")

    def committed(self) -> list[kc.Checkpoint]:
        return kc.DirectoryStore(self.store).committed()

    def wait_for_cell(self, cell: int) -> None:
        """Until the background checkpoint of cell [`cell`] committed."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            found = self.committed()
            if found and found[-1].manifest.get("cell") == cell:
                return
            time.sleep(0.02)
        raise SystemExit(f"no checkpoint of cell [{cell}] within {WAIT:g} s")

    def cache(self, state: str) -> None:
        """Put the store's files in `state`: `cold` (dropped from the page cache) or `warm`."""
        (evict if state == "cold" else warm)(self.store)

    def sigterm(self) -> tuple[float, dict[str, Any]]:
        """SIGTERM the launcher: seconds until it exited, and the kernel's checkpoint report."""
        started = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=WAIT)
        seconds = time.perf_counter() - started
        return seconds, self._report()

    def saves(self) -> list[tuple[float, float]]:
        """Of each continuous save so far, from the kernel's log: the ms the cell's reply waited
        for its page scan and fork, and the seconds the save took."""
        text = self.log.read_text(errors="replace")
        found = re.findall(r"continuous save \(forked in ([0-9.]+) ms.*? in ([0-9.]+) s", text)
        return [(float(ms), float(seconds)) for ms, seconds in found]

    def stop(self) -> None:
        self.client.stop_channels()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT)
        os.close(self.status_fd)

    def _report(self) -> dict[str, Any]:
        data = b""
        while select.select([self.status_fd], [], [], 5)[0]:
            chunk = os.read(self.status_fd, 65536)
            if not chunk:
                break
            data += chunk
        events = [json.loads(line) for line in data.splitlines() if line]
        found = [e for e in events if e.get("event") == "checkpoint"]
        if not found or not found[-1].get("checkpoint"):
            raise SystemExit(f"the kernel reported no checkpoint: {events}")
        return found[-1]


def _files(directory: Path) -> list[Path]:
    """The files of `directory`'s committed checkpoints (not of a save in progress, nor of one
    being deleted: the kernel's saves go on meanwhile)."""
    found = []
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        if entry.name.endswith((".partial", ".deleting")):
            continue
        try:
            found += [p for p in entry.iterdir() if p.is_file()] if entry.is_dir() else [entry]
        except (FileNotFoundError, NotADirectoryError):  # retired meanwhile
            continue
    return found


def evict(directory: Path) -> None:
    """Drop `directory`'s files from the page cache: fsync each (dirty pages are not dropped),
    then POSIX_FADV_DONTNEED. Only these files: a shared machine's other caches stay."""
    for path in _files(directory):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # a checkpoint retired meanwhile
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(directory: Path) -> None:
    """Read every file of `directory` once, so that the page cache holds it."""
    for path in _files(directory):
        try:
            with open(path, "rb") as file:
                while file.read(16 * MIB):
                    pass
        except FileNotFoundError:
            continue


NAMESPACE = """
import numpy as np
rng = np.random.default_rng(0)
arrays = {n} * [None]
for i in range(len(arrays)):
    arrays[i] = rng.random({elements})
small = rng.random(10 * 2**20 // 8)
history = [float(x) for x in range(10_000)]
"""
CHANGE_SMALL = "small[:] = rng.random(small.size)"
FLUSH_CASES = ("full", "committed", "in flight")
FLUSH_LABELS = {
    "full": "full save on SIGTERM (checkpoint.continuous off)",
    "committed": "SIGTERM once the cell's checkpoint committed",
    "in flight": "SIGTERM right after the cell's reply",
}


def flush_once(base: Path, case: str, cache: str) -> dict[str, float]:
    """One kernel with the 2 GiB namespace, SIGTERMed in `case`, its checkpoint files in `cache`:
    the flush's seconds (the kernel's report), SIGTERM to exit, MB the flush wrote."""
    setup = NAMESPACE.format(n=8, elements=256 * MIB // 8)
    name = f"{case.replace(' ', '-')}-{cache}"
    kernel = Kernel(base, name, checkpoints=True, continuous=case != "full")
    found: dict[str, float] = {}
    try:
        kernel.run(setup)
        if case != "full":
            kernel.wait_for_cell(1)  # the first checkpoint is a full one
        if case == "in flight":
            kernel.cache(cache)
        kernel.run(CHANGE_SMALL)  # cell [2]: one 10 MiB array changed
        if case == "committed":
            kernel.wait_for_cell(2)
        if case != "in flight":
            kernel.cache(cache)
        found["exit"], report = kernel.sigterm()
        # the save in flight it waited for, then its own (incremental) save
        found["waited"], found["own"] = float(report.get("waited", 0.0)), float(report["seconds"])
        found["flush"] = found["waited"] + found["own"]
        newest = kernel.committed()[-1]
        found["written MB"] = (report["bytes"] - int(newest.manifest.get("reused", 0))) / 1e6
        saves = kernel.saves()
        found["last background save"] = saves[-1][1] if saves else 0.0
    finally:
        kernel.stop()
        shutil.rmtree(kernel.store.parent, ignore_errors=True)
    return found


def flush(base: Path, repeat: int, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """`repeat` rounds of every (cache state, case), in an order that rotates between rounds."""
    rows = []
    for index in range(repeat):
        caches = CACHES if index % 2 == 0 else tuple(reversed(CACHES))
        for cache in caches:
            shift = index % len(FLUSH_CASES)
            for case in FLUSH_CASES[shift:] + FLUSH_CASES[:shift]:
                found = flush_once(base, case, cache)
                rows.append({"repeat": index, "cache": cache, "case": case, **found})
                progress(f"flush {index + 1}/{repeat} {cache} {case}: {found}")
    return rows


def calibrate(seconds: float = 1.0) -> int:
    """Loop iterations of the cells' CPU work that take about `seconds` here."""
    count, took = 100_000, 0.0
    while took < 0.2:
        count *= 2
        started = time.perf_counter()
        total = 0
        for i in range(count):
            total += i * i
        took = time.perf_counter() - started
    return int(count * seconds / took)


def _cell(work: int) -> str:
    """A cell of `work` loop steps of CPU work that also changes 1 MiB of one array, and prints
    the CPU seconds its thread used (page faults included: the main thread's own cost)."""
    steps = f"total = 0\nfor i in range({work}):\n    total += i * i\n"
    change = "arrays[0][:131072] = rng.random(131072)\n"
    return f"import time as _t\n_c = _t.thread_time()\n{steps}{change}print(_t.thread_time() - _c)"


BLOCK = 3
"""Cells run back to back (as "run all" does: a save overlaps the next cell) in one state
before the other state's turn; each cell is paired with the same place in the next block."""
TOGGLE = """
for _hook in get_ipython().events.callbacks["post_run_cell"]:
    if type(getattr(_hook, "__self__", None)).__name__ == "Continuous":
        _hook.__self__._stopped = {stopped}
"""
"""A silent request pausing or resuming the kernel's continuous checkpoints (its private
`_stopped`, as a shutdown sets it: no fork, no page scan, no activity file after a cell)."""


def per_cell(
    base: Path, repeat: int, cells: int, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Per repeat, a fresh kernel with continuous checkpoints running the same 1 s CPU cell in
    blocks of `BLOCK` back to back, the blocks alternating between checkpoints on and paused,
    `cells` each per cache state: the medians of each. One kernel, not an on and an off kernel:
    two kernels running the same cells differ here by up to 20% in CPU time, whatever they run.
    Before a paused block the last save ends, so that none of it lands on the paused cells."""
    setup = NAMESPACE.format(n=4, elements=48 * MIB // 8)  # 192 MiB + 10 MiB
    rows: list[dict[str, Any]] = []
    work = 0
    for index in range(repeat):
        kernel = Kernel(base, f"cells-{index}", checkpoints=True, continuous=True)
        try:
            kernel.run(setup)
            work = work or calibrate()
            for _ in range(2):  # scaled to 1 s of the cell thread's CPU in the kernel: not to
                kernel.run(_cell(work))  # wall time, which this machine's load stretches
                work = int(work / float(kernel.printed))
            cell = _cell(work)
            kernel.wait_for_cell(kernel.count)
            caches = CACHES if index % 2 == 0 else tuple(reversed(CACHES))
            for cache in caches:
                times: dict[str, list[float]] = {"on": [], "off": []}
                cpu: dict[str, list[float]] = {"on": [], "off": []}
                before = len(kernel.saves())
                for block in range(max(1, -(-cells // BLOCK))):
                    order = ["on", "off"] if (block + index) % 2 == 0 else ["off", "on"]
                    for state in order:
                        kernel.silent(TOGGLE.format(stopped=state == "off"))
                        for _ in range(min(BLOCK, cells - block * BLOCK)):
                            kernel.cache(cache)
                            times[state].append(kernel.run(cell))
                            cpu[state].append(float(kernel.printed))
                        if state == "on":
                            kernel.wait_for_cell(kernel.count)
                saves = kernel.saves()[before:]
                pairs = zip(times["on"], times["off"], strict=True)  # BLOCK cells apart at most
                cpu_pairs = zip(cpu["on"], cpu["off"], strict=True)
                row = {
                    "repeat": index,
                    "cache": cache,
                    "on": statistics.median(times["on"]),
                    "off": statistics.median(times["off"]),
                    "ratio": statistics.median(on / off for on, off in pairs),
                    "cpu ratio": statistics.median(on / off for on, off in cpu_pairs),
                    "saves": len(saves),
                    "save s": statistics.median(s for _, s in saves) if saves else 0.0,
                    "fork ms": statistics.median(ms for ms, _ in saves) if saves else 0.0,
                }
                rows.append(row)
                progress(f"per cell {index + 1}/{repeat} {cache}: {row}")
        finally:
            kernel.stop()
            shutil.rmtree(base / f"cells-{index}", ignore_errors=True)
    return rows


def spread(values: Sequence[float], form: str) -> str:
    """min / median / max of `values`, each in `form`."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return " / ".join(format(value, form) for value in (low, mid, high))


def verdict(values: Sequence[float], target: float) -> str:
    return "met" if max(values) <= target else "NOT met"


def print_flush(rows: list[dict[str, Any]], repeat: int) -> None:
    print(
        "flush: 2 GiB namespace (8 x 256 MiB float64 arrays + 10 MiB), the last cell changed the "
        f"10 MiB array; min / median / max of {repeat} repeats"
    )
    print("  flush: the kernel's report (the save in flight it waited for, then its own);")
    print("  ratios within a repeat, to the full save of the same repeat and cache state")
    for cache in CACHES:
        mine = [row for row in rows if row["cache"] == cache]
        full = {row["repeat"]: row for row in mine if row["case"] == "full"}
        state = "dropped from" if cache == "cold" else "read into"
        print(f"  {cache} (checkpoint files {state} the page cache first):")
        for case in FLUSH_CASES:
            found = [row for row in mine if row["case"] == case]
            seconds = [row["flush"] for row in found]
            exits = [row["exit"] for row in found]
            line = f"    {FLUSH_LABELS[case]:<50} flush {spread(seconds, '5.2f')} s"
            if case == "full":
                print(f"{line}, SIGTERM to exit {spread(exits, '5.2f')} s")
                continue
            ratios = [row["flush"] / full[row["repeat"]]["flush"] for row in found]
            exit_ratios = [row["exit"] / full[row["repeat"]]["exit"] for row in found]
            written = [row["written MB"] for row in found]
            print(
                f"{line} = {spread(ratios, '5.1%')} of the full save "
                f"(target <= {FLUSH_TARGET:.0%}: {verdict(ratios, FLUSH_TARGET)})"
            )
            print(
                f"    {'':<50} of it waiting for the save in flight "
                f"{spread([row['waited'] for row in found], '5.2f')} s, its own save "
                f"{spread([row['own'] for row in found], '5.2f')} s (writing "
                f"{spread(written, '.1f')} MB)"
            )
            print(
                f"    {'':<50} SIGTERM to exit {spread(exits, '5.2f')} s = "
                f"{spread(exit_ratios, '5.1%')} of the full save's (no target)"
            )


def print_cells(rows: list[dict[str, Any]], repeat: int, cells: int) -> None:
    print(
        f"per cell: 1 s CPU cells (each changes 1 MiB of a 48 MiB array) in a 202 MiB namespace, "
        f"continuous checkpoints on vs paused in one kernel, in alternating blocks of {BLOCK} "
        f"back to back; per repeat {cells} cells each, on/off the median of the {cells} ratios "
        f"of a cell to its pair in the next block; min / median / max of {repeat} repeats"
    )
    for cache in CACHES:
        mine = [row for row in rows if row["cache"] == cache]
        slowdowns = [row["ratio"] - 1 for row in mine]
        print(
            f"  {cache}: on {spread([r['on'] for r in mine], '.3f')} s, "
            f"paused {spread([r['off'] for r in mine], '.3f')} s (medians): on/off "
            f"{spread(slowdowns, '+.1%')} (target <= +{CELL_TARGET:.0%}: "
            f"{verdict(slowdowns, CELL_TARGET)})"
        )
        print(
            f"    background saves {spread([float(r['saves']) for r in mine], '.0f')} per "
            f"{cells} cells, {spread([r['save s'] for r in mine], '.2f')} s each (medians); the "
            f"reply waited for the page scan and fork {spread([r['fork ms'] for r in mine], '.1f')}"
            " ms (medians); the cell's own thread CPU on/off "
            f"{spread([r['cpu ratio'] - 1 for r in mine], '+.1%')} (no target: "
            "without the load others and the save put on the cores)"
        )


def report(repeat: int, cells: int, base_dir: str | None, only: str = "") -> None:
    """Run both parts and print them with their targets (`only`: "flush" or "cell")."""
    base = Path(tempfile.mkdtemp(prefix="kq-continuous-bench-", dir=base_dir))
    started = time.monotonic()

    def progress(text: str) -> None:
        print(f"  [{time.monotonic() - started:6.0f} s] {text}", file=sys.stderr, flush=True)

    try:
        flushes = flush(base, repeat, progress) if only != "cell" else []
        cost = per_cell(base, repeat, cells, progress) if only != "flush" and cells else []
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"continuous checkpoints ({os.cpu_count()} cores; load {os.getloadavg()[0]:.1f} now)")
    if flushes:
        print_flush(flushes, repeat)
    if cost:
        print_cells(cost, repeat, cells)


def _free_ports(count: int = 5) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="repeats of each case (>= 3)")
    parser.add_argument(
        "--cells", type=int, default=30, help="cells per kernel, repeat and cache state"
    )
    parser.add_argument("--only", choices=("flush", "cell"), default="", help="one part only")
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: temp)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3: a min, a median and a max")
    report(args.repeat, args.cells, args.dir, args.only)


if __name__ == "__main__":
    main()
