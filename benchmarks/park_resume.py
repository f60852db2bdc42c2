"""Parking on the local backend, timed: how soon a parked kernel's GPU is free, and how soon its
next cell answers once it is admitted again, each beside what it cannot avoid.

Each round: kernel A (1 pretend GPU, checkpoints on) builds a namespace of `--mib` MiB in 8
arrays; kernel B waits for the GPU; A is parked. Measured on the server side:
- flush: from the park to the kernel's checkpoint report (it saved and said so);
- GPU free: from the park to B's admission. Target: GPU free <= flush + 1 s.
Then B is shut down and A is woken with a cell already sent (as a notebook's next cell does):
- admission -> output: from A's re-admission to that cell's output;
- the kernel's own start: admission -> output of a kernel with nothing to restore (C);
- restore: `checkpoint.snapshot.restore` of A's checkpoint in this process.
Target: admission -> output <= own start + restore + 0.5 s.
Usage: python benchmarks/park_resume.py [--rounds 3] [--mib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

SETUP = """
import numpy as np
arrays = [np.random.default_rng(i).random({n}) for i in range(8)]
label = "kept"
"""


def _kernelspec(name: str, store: Path | None) -> dict[str, Any]:
    config: dict[str, Any] = {"backend": "local", "queue": "gpu", "gpus": 1}
    if store is not None:
        config["checkpoint"] = {"enabled": True, "path": str(store), "grace_seconds": 120}
    return {
        "argv": [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"],
        "display_name": name,
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {"kernel_provisioner": {"provisioner_name": "kernel-queue", "config": config}},
    }


async def _until(check: Callable[[], bool], within: float = 300.0) -> float:
    """Poll `check` every millisecond; return the perf_counter time it first held."""
    deadline = time.perf_counter() + within
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError("the benchmark's condition did not hold in time")
        await asyncio.sleep(0.001)
    return time.perf_counter()


def _state(km: Any) -> str:
    session = km.provisioner.kernel_session
    tracker = session.tracker if session is not None else None
    return "" if tracker is None else str(tracker.lifecycle.state)


async def _output(client: Any, code: str) -> float:
    """Send `code` now; return the time its first output (result or stream) arrived."""
    msg_id = client.execute(code)
    while True:
        msg = await client.get_iopub_msg(timeout=300)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("execute_result", "error"):
            return time.perf_counter()


async def _fresh_start(admitted_to_output: list[float]) -> None:
    """A kernel with nothing to restore: admission -> first output (the kernel's own start)."""
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="fresh")
    start = asyncio.ensure_future(km.start_kernel())
    admitted = await _until(lambda: km.provisioner is not None and _state(km) != "queued")
    await start
    client = km.client()
    client.start_channels()
    try:
        done = await _output(client, "1")
        admitted_to_output.append(done - admitted)
    finally:
        client.stop_channels()
        await km.shutdown_kernel(now=False)


async def _round(mib: int, store: Path, results: dict[str, list[float]]) -> None:
    from jupyter_client.manager import AsyncKernelManager

    from kernel_queue import backends, checkpoint
    from kernel_queue.checkpoint import snapshot, stores

    a = AsyncKernelManager(kernel_name="saved")
    await a.start_kernel()
    client = a.client()
    client.start_channels()
    await client.wait_for_ready(timeout=120)
    n = mib * (1 << 20) // 8 // 8
    reply = await client.execute_interactive(SETUP.format(n=n), timeout=300)
    assert reply["content"]["status"] == "ok", reply
    b = AsyncKernelManager(kernel_name="saved")
    b_start = asyncio.ensure_future(b.start_kernel())
    await _until(lambda: b.provisioner is not None and _state(b) == "queued")
    backend: Any = backends.get_backend(
        "local", owner=asyncio.get_running_loop(), config=None, log=None
    )
    group = backend._groups[a.kernel_id]

    reports: list[float] = []  # when the launcher reported its checkpoint after the park
    heard = group.on_launcher_event

    def stamped(event: dict[str, Any], **kw: Any) -> None:
        if event.get("event") == "checkpoint":
            reports.append(time.perf_counter())
        heard(event, **kw)

    group.on_launcher_event = stamped
    parked = time.perf_counter()
    await a.provisioner.kernel_session.park()
    await _until(lambda: bool(reports))
    flushed = reports[0]
    free = await _until(lambda: _state(b) not in ("queued", ""))
    results["flush"].append(flushed - parked)
    results["gpu free"].append(free - parked)

    await b_start
    await b.shutdown_kernel(now=False)
    await a.provisioner.kernel_session.resume()
    admitted = await _until(lambda: _state(a) in ("admitted", "resumed", "running"))
    done = await _output(client, "label, len(arrays)")
    results["admission -> output"].append(done - admitted)

    committed = stores.DirectoryStore(store / a.kernel_id).committed()  # the restored one too
    assert committed, "no checkpoint to restore"
    latest = committed[-1]
    module = types.ModuleType("__restore_benchmark__")
    started = time.perf_counter()
    report = snapshot.restore(module, latest)
    results["restore"].append(time.perf_counter() - started)
    assert isinstance(report, checkpoint.RestoreReport)
    client.stop_channels()
    await a.shutdown_kernel(now=False)


async def main(rounds: int, mib: int, store: Path) -> None:
    from kernel_queue import backends

    results: dict[str, list[float]] = {
        k: [] for k in ("flush", "gpu free", "admission -> output", "restore", "own start")
    }
    try:
        for _ in range(rounds):
            await _round(mib, store, results)
            await _fresh_start(results["own start"])
    finally:
        await backends.aclose_all(asyncio.get_running_loop())
    m = {k: statistics.median(v) for k, v in results.items()}
    print(f"rounds: {rounds}, namespace {mib} MiB in 8 arrays, medians")
    for name, value in m.items():
        print(f"  {name:22} {value * 1000:7.0f} ms")
    gpu_margin = m["gpu free"] - m["flush"]
    print(f"park -> GPU free minus flush: {gpu_margin * 1000:.0f} ms (target <= 1000 ms)")
    back_margin = m["admission -> output"] - m["own start"] - m["restore"]
    print(
        "admission -> output minus own start and restore: "
        f"{back_margin * 1000:.0f} ms (target <= 500 ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        store = Path(data) / "checkpoints"
        for name, spec in (
            ("saved", _kernelspec("saved", store)),
            ("fresh", _kernelspec("fresh", None)),
        ):
            folder = Path(data) / "kernels" / name
            folder.mkdir(parents=True)
            (folder / "kernel.json").write_text(json.dumps(spec))
        os.environ["JUPYTER_PATH"] = data
        os.environ["KERNEL_QUEUE_PRETEND_GPUS"] = "1"
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        asyncio.run(main(args.rounds, args.mib, store))
