"""Start-to-ready of a queued kernel on the local backend vs jupyter_client's local provisioner.

Runs both side by side in one process, alternating, and prints the medians and their ratio
(target: queued <= 1.25 x plain, DESIGN.md "launch overhead"). No GPU needed: the local backend
is given a pretend inventory. Usage: python benchmarks/launch_overhead.py [--runs 7]
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
from pathlib import Path

PLAIN = {
    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    "display_name": "plain",
    "language": "python",
}
QUEUED = {
    "argv": [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"],
    "display_name": "queued",
    "language": "python",
    "interrupt_mode": "message",
    "metadata": {
        "kernel_provisioner": {
            "provisioner_name": "kernel-queue",
            "config": {"backend": "local", "queue": "gpu", "gpus": 1},
        }
    },
}


async def start_to_ready(name: str) -> float:
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name=name)
    started = time.perf_counter()
    await km.start_kernel()
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        return time.perf_counter() - started
    finally:
        client.stop_channels()
        await km.shutdown_kernel(now=False)


async def main(runs: int) -> None:
    times: dict[str, list[float]] = {"plain": [], "queued": []}
    for _ in range(runs):
        for name in times:
            times[name].append(await start_to_ready(name))
    plain, queued = (statistics.median(times[n]) for n in ("plain", "queued"))
    print(f"runs per kind:          {runs}")
    print(f"plain  (LocalProvisioner) median start-to-ready: {plain * 1000:7.0f} ms")
    print(f"queued (local backend)    median start-to-ready: {queued * 1000:7.0f} ms")
    print(f"ratio queued / plain: {queued / plain:.2f} (target <= 1.25)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        for spec in (PLAIN, QUEUED):
            folder = Path(data) / "kernels" / str(spec["display_name"])
            folder.mkdir(parents=True)
            (folder / "kernel.json").write_text(json.dumps(spec))
        os.environ["JUPYTER_PATH"] = data
        os.environ["KERNEL_QUEUE_PRETEND_GPUS"] = "1"
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        asyncio.run(main(args.runs))
