"""Continuous checkpoints, measured on real launchers and kernels (part of checkpoint_speed.py).

`flush`: a 2 GiB namespace (8 float64 arrays of 256 MiB) whose last cell changed one 10 MiB
array; the SIGTERM flush (the kernel's own save, from its report) against a full save of the same
namespace by a kernel without continuous checkpoints (target: <= 10%), in two cases: SIGTERM once
the last cell's background checkpoint committed, and SIGTERM right after the cell's reply (the
save still in flight: the launcher's exit is then the honest measure, SIGTERM to exit 143).
`per_cell`: 1 s cells of CPU work (a Python loop, each cell also changing a 1 MiB array) in a
200 MiB namespace, continuous checkpoints on against checkpoints off, cells alternating between
the two kernels so that the machine's load falls on both (target: median slowdown <= 5%).
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient

import kernel_queue.checkpoint as kc
from kernel_queue.launcher import contract

REPO = Path(__file__).resolve().parents[1]
KEY = "benchmark-key"
WAIT = 300.0
MIB = 2**20


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
        log = open(self.store.parent / "launcher.log", "wb")  # noqa: SIM115 - closed in stop()
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

    def run(self, code: str) -> float:
        """Run a cell; the seconds from the request to its reply (what the user waits)."""
        started = time.perf_counter()
        reply = self.client.execute_interactive(code, timeout=WAIT, output_hook=lambda m: None)
        seconds = time.perf_counter() - started
        if reply["content"]["status"] != "ok":
            raise SystemExit(f"cell failed: {reply['content']}")
        return seconds

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

    def sigterm(self) -> tuple[float, dict[str, Any]]:
        """SIGTERM the launcher: seconds until it exited, and the kernel's checkpoint report."""
        started = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=WAIT)
        seconds = time.perf_counter() - started
        return seconds, self._report()

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


def flush(base: Path) -> dict[str, float]:
    """Seconds of: a full SIGTERM save of the 2 GiB namespace; the SIGTERM flush once the last
    cell's checkpoint committed; SIGTERM to exit once committed, and right after the reply."""
    setup = NAMESPACE.format(n=8, elements=256 * MIB // 8)
    found: dict[str, float] = {}
    full = Kernel(base, "full", checkpoints=True, continuous=False)
    try:
        full.run(setup)
        full.run(CHANGE_SMALL)
        found["full exit"], report = full.sigterm()
        found["full save"] = float(report["seconds"])
    finally:
        full.stop()
    shutil.rmtree(full.store.parent, ignore_errors=True)
    for case in ("committed", "in flight"):
        kernel = Kernel(base, case.replace(" ", "-"), checkpoints=True, continuous=True)
        try:
            kernel.run(setup)
            kernel.wait_for_cell(1)  # the first checkpoint is a full one
            kernel.run(CHANGE_SMALL)  # cell [2]: one 10 MiB array changed
            if case == "committed":
                kernel.wait_for_cell(2)
            found[f"{case} exit"], report = kernel.sigterm()
            # the save in flight it waited for, then its own (incremental) save
            found[f"{case} flush"] = float(report.get("waited", 0.0)) + float(report["seconds"])
            found[f"{case} written MB"] = (report["bytes"] - _reused(kernel)) / 1e6
        finally:
            kernel.stop()
        log = (kernel.store.parent / "launcher.log").read_text(errors="replace")
        forks = [float(ms) for ms in re.findall(r"forked in ([0-9.]+) ms", log)]
        found["fork ms"] = max([*forks, found.get("fork ms", 0.0)])
        shutil.rmtree(kernel.store.parent, ignore_errors=True)
    return found


def _reused(kernel: Kernel) -> int:
    newest = kernel.committed()[-1]
    return int(newest.manifest.get("reused", 0))


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
    """A cell of `work` loop steps of CPU work that also changes 1 MiB of one array."""
    steps = f"total = 0\nfor i in range({work}):\n    total += i * i\n"
    return steps + "arrays[0][:131072] = rng.random(131072)"


def per_cell(base: Path, cells: int) -> dict[str, float]:
    """Median seconds of a 1 s CPU cell with continuous checkpoints on and with checkpoints off."""
    setup = NAMESPACE.format(n=4, elements=48 * MIB // 8)  # 192 MiB + 10 MiB
    kernels = {
        "on": Kernel(base, "on", checkpoints=True, continuous=True),
        "off": Kernel(base, "off", checkpoints=False, continuous=False),
    }
    times: dict[str, list[float]] = {name: [] for name in kernels}
    try:
        for kernel in kernels.values():
            kernel.run(setup)
        work = calibrate()  # then scaled to a 1 s cell in a kernel (cell code runs slower)
        work = int(work / kernels["off"].run(_cell(work)))
        cell = _cell(work)
        kernels["on"].wait_for_cell(1)
        for index in range(cells):
            order = list(kernels) if index % 2 else list(reversed(kernels))
            for name in order:
                times[name].append(kernels[name].run(cell))
        saves = len(kernels["on"].committed())
    finally:
        for kernel in kernels.values():
            kernel.stop()
    return {
        "on": statistics.median(times["on"]),
        "off": statistics.median(times["off"]),
        "saves kept": float(saves),
    }


def report(size_note: str, cells: int, base_dir: str | None) -> None:
    """Run both and print them side by side with their targets."""
    base = Path(tempfile.mkdtemp(prefix="kq-continuous-bench-", dir=base_dir))
    try:
        found = flush(base)
        cost = per_cell(base, cells)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    full = found["full save"]
    print(f"continuous checkpoints ({size_note}): 8 x 256 MiB arrays, the last cell changed 10 MiB")
    print("  (flush: the save in flight it waited for, then its own; exit: SIGTERM to exit 143)")
    print(f"  full save on SIGTERM (checkpoint.continuous off)   {full:6.2f} s")
    for case in ("committed", "in flight"):
        label = {
            "committed": "SIGTERM once the cell's checkpoint committed",
            "in flight": "SIGTERM right after the cell's reply",
        }[case]
        seconds, exit_ = found[f"{case} flush"], found[f"{case} exit"]
        print(
            f"  {label:<50} flush {seconds:5.2f} s = {seconds / full:5.1%} of the full save "
            f"(target <= 10%); SIGTERM to exit {exit_:5.2f} s = {exit_ / found['full exit']:5.1%} "
            f"of the full save's; the flush wrote {found[f'{case} written MB']:.1f} MB"
        )
    print(f"  the longest fork at a cell boundary of the 2 GiB kernel: {found['fork ms']:.1f} ms")
    slowdown = cost["on"] / cost["off"] - 1
    print(
        f"per-cell cost, 1 s CPU cells in a 202 MiB namespace, median of {cells}: "
        f"{cost['on']:.3f} s with continuous checkpoints, {cost['off']:.3f} s without: "
        f"{slowdown:+.1%} (target <= +5%)"
    )


def _free_ports(count: int = 5) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


if __name__ == "__main__":
    report("alone", int(sys.argv[1]) if len(sys.argv) > 1 else 15, None)
