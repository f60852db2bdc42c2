"""Start-to-ready of a queued kernel vs jupyter_client's local provisioner, side by side.

Kinds run alternately in one process; each kind's min/median/max and its ratio of medians to the
plain kernel are printed beside the project's "launch overhead" targets (local backend <= 1.05 x
plain, kubernetes on the fake cluster <= 1.10 x plain). "queued" is the local backend with a
pretend GPU; "kubernetes" is the kubernetes backend on the fake cluster with instant admission
(the pod's kernel runs on this machine, reached through its Service, from the launcher archive;
the fake reads Kueue's CRDs from $KERNEL_QUEUE_FAKE_CLUSTER_CRDS, which scripts/env sets).
kernel_queue's bytecode is written first, as pip writes it at install: under
PYTHONDONTWRITEBYTECODE the local backend's launcher and kernel would otherwise compile an edited
checkout's modules from source at every launch, which the plain kernel's installed ipykernel never
does (the fake cluster's pods run the launcher archive, which carries its own bytecode).
Usage: python benchmarks/launch_overhead.py [--runs 7] [--no-kubernetes]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import kernel_queue
from kernel_queue.cli.install import kernel_json

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


KUBE = kernel_json(
    display_name="kubernetes", backend="kubernetes", queue="user-queue", gpus=1, image="any"
)


async def start_to_ready(name: str, config: object = None) -> float:
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name=name, config=config)
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


async def main(runs: int, kubernetes: bool) -> None:
    from traitlets.config import Config

    times: dict[str, list[float]] = {"plain": [], "queued": []}
    config = None
    if kubernetes:
        from kernel_queue_fake_cluster.cluster import FakeCluster

        cluster = FakeCluster()
        await cluster.start()
        cluster.setup_queues(quota={"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 8})
        config = Config({"KubernetesBackend": {"kubeconfig": str(cluster.kubeconfig)}})
        times["kubernetes"] = []
    try:
        for _ in range(runs):
            for name in times:
                times[name].append(await start_to_ready(name, config))
    finally:
        from kernel_queue import backends

        await backends.aclose_all(asyncio.get_running_loop())
        if kubernetes:
            await cluster.stop()
    report(times)


LABELS = {
    "plain": "plain (LocalProvisioner)",
    "queued": "queued (local backend)",
    "kubernetes": "kubernetes (fake cluster)",
}
TARGETS = {"queued": 1.05, "kubernetes": 1.10}
"""The most a kind's median start-to-ready may be, as a multiple of the plain kernel's."""


def report(times: dict[str, list[float]]) -> None:
    """Each kind's min/median/max start-to-ready, and its ratio of medians to plain."""
    plain = statistics.median(times["plain"])
    print(f"start-to-ready, {len(times['plain'])} runs per kind (min / median / max)")
    for name, samples in times.items():
        median = statistics.median(samples)
        spread = "/".join(f"{value * 1000:.0f}" for value in (min(samples), median, max(samples)))
        line = f"{LABELS[name]:27} {spread:>16} ms"
        if name in TARGETS:
            line += f"   ratio to plain {median / plain:.2f} (target <= {TARGETS[name]:.2f})"
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-kubernetes", action="store_true", help="skip the fake cluster")
    args = parser.parse_args()
    compileall.compile_dir(Path(kernel_queue.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory() as data:
        for spec in (PLAIN, QUEUED, KUBE):
            folder = Path(data) / "kernels" / str(spec["display_name"])
            folder.mkdir(parents=True)
            (folder / "kernel.json").write_text(json.dumps(spec))
        os.environ["JUPYTER_PATH"] = data
        os.environ["KERNEL_QUEUE_PRETEND_GPUS"] = "1"
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        asyncio.run(main(args.runs, not args.no_kubernetes))
