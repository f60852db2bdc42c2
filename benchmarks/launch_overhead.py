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
For the queued kinds it also prints where the time went, from the provisioner's status events:
start to admitted, admitted to running (the launcher's kernel has bound its ports; on Kubernetes
the pod is Ready), running to the first kernel_info reply.
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


PHASES = ("admitted", "running", "ready")
"""The queued kinds' phases, each from the previous (the first from the start): the queue's
admission, the launcher's report that its kernel runs (on Kubernetes: its pod Ready), and the
kernel's first kernel_info reply."""


async def start_to_ready(
    name: str, config: object = None, phases: dict[str, list[float]] | None = None
) -> float:
    """One start of kernel `name` to its kernel_info reply; where `phases` is given, the time
    of each of `PHASES` is added to it, read from the provisioner's status events."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_events import EventLogger

    from kernel_queue import events

    seen: dict[str, float] = {}
    event_logger = EventLogger()
    event_logger.register_event_schema(events.SCHEMA_PATH)

    async def heard(logger: object, schema_id: str, data: dict[str, object]) -> None:
        seen.setdefault(str(data["state"]), time.perf_counter())  # jupyter_events: keywords

    event_logger.add_listener(schema_id=events.SCHEMA_ID, listener=heard)
    km = AsyncKernelManager(kernel_name=name, config=config)
    km.event_logger = event_logger  # what jupyter_server's kernel manager has, and our events go to
    started = time.perf_counter()
    await km.start_kernel()
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        ready = time.perf_counter()
    finally:
        client.stop_channels()
        await km.shutdown_kernel(now=False)
    if phases is not None:
        seen["ready"] = ready
        previous = started
        for phase in PHASES:
            at = seen.get(phase, previous)
            phases.setdefault(phase, []).append(at - previous)
            previous = at
    return ready - started


async def main(runs: int, kubernetes: bool) -> None:
    from traitlets.config import Config

    times: dict[str, list[float]] = {"plain": [], "queued": []}
    phases: dict[str, dict[str, list[float]]] = {"queued": {}, "kubernetes": {}}
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
                times[name].append(await start_to_ready(name, config, phases.get(name)))
    finally:
        from kernel_queue import backends

        await backends.aclose_all(asyncio.get_running_loop())
        if kubernetes:
            await cluster.stop()
    report(times, phases)


LABELS = {
    "plain": "plain (LocalProvisioner)",
    "queued": "queued (local backend)",
    "kubernetes": "kubernetes (fake cluster)",
}
TARGETS = {"queued": 1.05, "kubernetes": 1.10}
"""The most a kind's median start-to-ready may be, as a multiple of the plain kernel's."""


def report(times: dict[str, list[float]], phases: dict[str, dict[str, list[float]]]) -> None:
    """Each kind's min/median/max start-to-ready, its ratio of medians to plain, and where a
    queued kind's time went (the median of each phase)."""
    plain = statistics.median(times["plain"])
    print(f"start-to-ready, {len(times['plain'])} runs per kind (min / median / max)")
    for name, samples in times.items():
        median = statistics.median(samples)
        spread = "/".join(f"{value * 1000:.0f}" for value in (min(samples), median, max(samples)))
        line = f"{LABELS[name]:27} {spread:>16} ms"
        if name in TARGETS:
            line += f"   ratio to plain {median / plain:.2f} (target <= {TARGETS[name]:.2f})"
        print(line)
    for name, spent in phases.items():
        if spent:
            parts = ", ".join(f"{p} +{statistics.median(spent[p]) * 1000:.0f}" for p in PHASES)
            print(f"  {LABELS[name]} phases (median ms): {parts}")


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
