"""Start-to-ready of a queued kernel vs jupyter_client's local provisioner, side by side.

Kinds run alternately, run by run; each kind's min/median/max and its ratio of medians to the
plain kernel are printed beside the project's "launch overhead" targets (local backend <= 1.05 x
plain, kubernetes <= 1.10 x plain). "queued" is the local backend with a pretend GPU, which
keeps a launcher started ahead (`c.LocalBackend.spare_launcher`); "queued, no spare launcher" is
the same backend with that off, so the spare's share shows beside it. The
kubernetes kinds are the kubernetes backend on a cluster outside this process, as a Jupyter
server meets its API server in production (never in its own process), with instant admission
(quota: 8 CPU, 32Gi, 8 GPUs):
- "kubernetes (fake cluster)" (`--plane fake`, the default): the fake cluster in a child process
  (this script run with `--serve-cluster`, through `cluster_process.ClusterProcess`): its API
  server, Kueue and kubelet on their own loop and CPU. The pod's kernel runs on this machine,
  reached through its Service, from the launcher archive. The fake reads Kueue's CRDs from
  $KERNEL_QUEUE_FAKE_CLUSTER_CRDS, which scripts/env sets.
- "kubernetes (real plane)" (`--plane real`): the real control plane
  (`cluster_process.RealPlane`: kube-apiserver, etcd, kube-scheduler, kube-controller-manager,
  Kueue 0.19 and the node agent, each a process of its own; `scripts/control-plane build` first,
  else this plane is skipped, saying so). The server authenticates as etc/kubernetes/rbac.yaml's
  service account; the node agent runs the pod's launcher archive with this environment's
  python (the kernelspec's image mapped to its bin dir), as the fake's kubelet does.
`--plane both` runs both, each a kind of its own with its own backend; `--no-kubernetes` neither.
Beside each plane's kind, "plain pod" is a plain kernel in a pod of that plane (`PlainPods`: no
kernel-queue, no Kueue; `python -m ipykernel_launcher` as soon as the scheduler and the node agent
run it, reached with its connection file): what the plane alone adds to a kernel's start. Each
kubernetes kind's line gives its ratio to that pod's median too: what kernel-queue and Kueue add
to a kernel in a pod.
kernel_queue's bytecode is written first, as pip writes it at install: under
PYTHONDONTWRITEBYTECODE the local backend's launcher and kernel would otherwise compile an edited
checkout's modules from source at every launch, which the plain kernel's installed ipykernel never
does (the clusters' pods run the launcher archive, which carries its own bytecode).
For the queued kinds it also prints where the time went, from the provisioner's status events:
start to admitted, admitted to running (the launcher's kernel has bound its ports; on Kubernetes
the server reached the started kernel on its shell port), running to the first kernel_info
reply; for the kubernetes kinds, when the plane's objects reached each of `STEPS`, watched on a
connection of the benchmark's own. The node agents of both planes probe readiness as a kubelet
does, every periodSeconds.
Usage: python benchmarks/launch_overhead.py [--runs 7] [--plane fake|real|both] [--no-kubernetes]
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
from typing import Any

from cluster_process import ClusterProcess, RealPlane, queues, serve_fake_cluster  # benchmarks/

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
IMAGE = "any"
"""The kubernetes kernel's image: on the real plane's node, this environment's bin dir."""
KUBE = kernel_json(
    display_name="kubernetes", backend="kubernetes", queue="user-queue", gpus=1, image=IMAGE
)
QUOTA: dict[str, str | int] = {"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 8}
"""Both planes' ClusterQueue quota: each kernel is admitted at once."""
KERNELS = {
    "plain": "plain",
    "queued": "queued",
    "cold": "queued",
    "fake": "kubernetes",
    "real": "kubernetes",
}
"""Kind -> its kernelspec's name."""


PHASES = ("admitted", "running", "ready")
"""The queued kinds' phases, each from the previous one seen (the first from the start): the
queue's admission, the launcher's report that its kernel runs (on Kubernetes: the server
reached it), and the kernel's first kernel_info reply. A phase whose event did not come is
reported so, its time counted in the next phase's."""


async def start_to_ready(
    name: str, parent: Any = None, phases: dict[str, list[float]] | None = None
) -> float:
    """One start of kernel `name` to its kernel_info reply; where `phases` is given, the time
    of each of `PHASES` is added to it, read from the provisioner's status events. `parent`
    (as the server's multi-kernel manager is) carries the config and owns the backend."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_events import EventLogger

    from kernel_queue import events

    seen: dict[str, float] = {}
    event_logger = EventLogger()
    event_logger.register_event_schema(events.SCHEMA_PATH)

    async def heard(logger: object, schema_id: str, data: dict[str, object]) -> None:
        seen.setdefault(str(data["state"]), time.perf_counter())  # jupyter_events: keywords

    event_logger.add_listener(schema_id=events.SCHEMA_ID, listener=heard)
    km = AsyncKernelManager(kernel_name=name, parent=parent)
    km.event_logger = event_logger  # what jupyter_server's kernel manager has, and our events go to
    started = time.perf_counter()
    await km.start_kernel()
    try:
        ready = await first_reply(km.client())
    finally:
        await km.shutdown_kernel(now=False)
    if phases is not None:
        seen["ready"] = ready
        previous = started
        for phase in PHASES:
            if phase in seen:
                phases.setdefault(phase, []).append(seen[phase] - previous)
                previous = seen[phase]
    return ready - started


async def first_reply(client: Any) -> float:
    """When the kernel of `client` first answers kernel_info (`time.perf_counter`), the client's
    channels started for it and stopped after."""
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        return time.perf_counter()
    finally:
        client.stop_channels()


STEPS = ("pod", "workload", "admitted", "ungated", "bound", "container")
"""A kubernetes start's steps as the plane's objects show them: the head pod made (gated),
Kueue's Workload made, then admitted, the pod ungated, bound to the node, and its kernel
container running (then the launcher and the kernel start in it)."""


class Steps:
    """When each of `STEPS` was first seen in one start, by watches of the plane's namespace on
    a connection of their own (an observer beside the server's). One start at a time: objects
    first added after `begin` are that start's."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.samples: dict[str, list[float]] = {}
        self._started = 0.0
        self._seen: dict[str, float] = {}
        self._ours: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._api: Any = None

    async def start(self) -> None:
        from kernel_queue.kube import kueue
        from kernel_queue.kube.client.api import KubernetesApi
        from kernel_queue.kube.objects import preflight

        self._api = await KubernetesApi.connect(self.kubeconfig)
        workloads = (await preflight.Discovery().versions(self._api)).workloads
        for kind in (kueue.PODS, workloads):
            self._tasks.append(asyncio.create_task(self._follow(kind)))

    async def _follow(self, kind: Any) -> None:
        while True:
            _, version = await self._api.list(kind, "default")
            async for event, obj in self._api.watch(kind, "default", resource_version=version):
                if event in ("ADDED", "MODIFIED"):
                    self._observe(event, obj, pod=kind.plural == "pods")

    def _observe(self, event: str, obj: dict[str, Any], *, pod: bool) -> None:
        from kernel_queue.kube import kueue

        uid = str(obj["metadata"].get("uid", ""))
        if event == "ADDED" and self._started:
            self._ours.add(uid)
        if uid not in self._ours:
            return
        if not pod:
            reached = ["workload"] + (["admitted"] if kueue.workload_admitted(obj) else [])
        else:
            status = obj.get("status") or {}
            running = any(
                (c.get("state") or {}).get("running") is not None
                for c in status.get("containerStatuses") or []
            )
            reached = ["pod"] + (["ungated"] if not kueue.is_gated(obj) else [])
            reached += ["bound"] if (obj.get("spec") or {}).get("nodeName") else []
            reached += ["container"] if running else []
        for step in reached:
            self._seen.setdefault(step, time.perf_counter() - self._started)

    def begin(self) -> None:
        self._started, self._seen, self._ours = time.perf_counter(), {}, set()

    def end(self) -> None:
        """Keep this start's steps."""
        for step, seconds in self._seen.items():
            self.samples.setdefault(step, []).append(seconds)
        self._started = 0.0

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._api is not None:
            await self._api.aclose()


class PlainPods:
    """A plain kernel in a pod of the plane, one start at a time: no kernel-queue and no Kueue
    (the pod names no queue, so Kueue leaves it alone), `python -m ipykernel_launcher` on a
    connection file made beside it, reached as a client holding that file reaches it. What
    the plane itself costs a kernel's start, with nothing of ours in it."""

    def __init__(self, kubeconfig: str, folder: Path) -> None:
        self.kubeconfig, self.folder = kubeconfig, folder
        self._api: Any = None
        self._count = 0

    async def start(self) -> None:
        from kernel_queue.kube.client.api import KubernetesApi

        self._api = await KubernetesApi.connect(self.kubeconfig)

    async def start_to_ready(self) -> float:
        """One start: the pod created to the kernel's first kernel_info reply, with
        jupyter_client's own client as for the plain kernel; then the pod is deleted and gone."""
        from jupyter_client.asynchronous import AsyncKernelClient
        from jupyter_client.connect import write_connection_file

        from kernel_queue.kube import kueue
        from kernel_queue.kube.objects import manifests

        self._count += 1
        name = f"plain-kernel-{self._count}"
        connection, _ = write_connection_file(
            str(self.folder / f"{name}.json"), ip="0.0.0.0", key=os.urandom(16).hex().encode()
        )
        container = {
            "name": "kernel",
            "image": IMAGE,
            "command": ["python", "-m", "ipykernel_launcher", "-f", connection],
            "securityContext": manifests.CONTAINER_SECURITY,
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [container],
                "restartPolicy": "Never",
                "securityContext": manifests.POD_SECURITY,
            },
        }
        client = AsyncKernelClient()
        client.load_connection_file(connection)
        client.ip = "127.0.0.1"
        started = time.perf_counter()
        await self._api.create(kueue.PODS, "default", pod)
        try:
            ready = await first_reply(client)
        finally:
            await self._api.delete(kueue.PODS, "default", name, grace_seconds=0)
            await self._gone(name)
        return ready - started

    async def _gone(self, name: str) -> None:
        from kernel_queue import errors
        from kernel_queue.kube import kueue

        for _ in range(600):
            try:
                await self._api.get(kueue.PODS, "default", name)
            except errors.ClusterNotFound:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"pod {name} was not gone 30 s after its delete")

    async def aclose(self) -> None:
        if self._api is not None:
            await self._api.aclose()


def owner(kubeconfig: str) -> Any:
    """What a kind's kernel managers hang from: its config (the plane's kubeconfig) and the
    owner of its own kubernetes backend, as a server's multi-kernel manager is (kernel managers
    without one would share one backend per event loop, the first plane's)."""
    from traitlets.config import Config, LoggingConfigurable

    return LoggingConfigurable(config=Config({"KubernetesBackend": {"kubeconfig": kubeconfig}}))


async def main(runs: int, planes: list[str], root: Path) -> None:
    from traitlets.config import Config, LoggingConfigurable

    from kernel_queue import backends

    times: dict[str, list[float]] = {"plain": [], "queued": [], "cold": []}
    phases: dict[str, dict[str, list[float]]] = {"queued": {}, "cold": {}}
    # the local backend without its spare launcher: a backend of its own (its own owner)
    cold = Config({"LocalBackend": {"spare_launcher": False}})
    parents: dict[str, Any] = {"cold": LoggingConfigurable(config=cold)}
    kubeconfigs: dict[str, str] = {}
    steps: dict[str, Steps] = {}
    plain_pods: dict[str, PlainPods] = {}
    fake, real = ClusterProcess(__file__), RealPlane()
    try:
        if "fake" in planes:
            kubeconfigs["fake"] = await fake.start(root / "cluster")
        if "real" in planes:
            from kernel_queue_fake_cluster.control_plane.plane import NodeSpec

            # the pod's `python` is this environment's, as the fake's kubelet runs it
            node = NodeSpec(gpus=8, image_paths={IMAGE: str(Path(sys.executable).parent)})
            kubeconfigs["real"] = await real.start(root, node=node, queues=queues(QUOTA))
        for kind, kubeconfig in kubeconfigs.items():
            parents[kind], steps[kind] = owner(kubeconfig), Steps(kubeconfig)
            times[kind], phases[kind] = [], {}
            await steps[kind].start()
            plain_pods[kind] = PlainPods(kubeconfig, root)
            times[f"{kind}-pod"] = []
            await plain_pods[kind].start()
        for _ in range(runs):
            for kind in times:
                if kind.endswith("-pod"):
                    times[kind].append(await plain_pods[kind[: -len("-pod")]].start_to_ready())
                    continue
                if kind in steps:
                    steps[kind].begin()
                times[kind].append(
                    await start_to_ready(KERNELS[kind], parents.get(kind), phases.get(kind))
                )
                if kind in steps:
                    steps[kind].end()
    finally:
        for watcher in [*steps.values(), *plain_pods.values()]:
            await watcher.aclose()
        await backends.aclose_all(asyncio.get_running_loop())
        for parent in parents.values():
            await backends.aclose_all(parent)
        await fake.stop()
        await real.stop()
    report(times, phases, {kind: watcher.samples for kind, watcher in steps.items()})


LABELS = {
    "plain": "plain (LocalProvisioner)",
    "queued": "queued (local backend)",
    "cold": "queued, no spare launcher",
    "fake": "kubernetes (fake cluster)",
    "real": "kubernetes (real plane)",
    "fake-pod": "plain pod (fake cluster)",
    "real-pod": "plain pod (real plane)",
}
TARGETS = {"queued": 1.05, "fake": 1.10, "real": 1.10}
"""The most a kind's median start-to-ready may be, as a multiple of the plain kernel's."""


def report(
    times: dict[str, list[float]],
    phases: dict[str, dict[str, list[float]]],
    steps: dict[str, dict[str, list[float]]],
) -> None:
    """Each kind's min/median/max start-to-ready, its ratio of medians to plain, where a
    queued kind's time went (the median of each phase) and, for a kubernetes kind, when its
    objects reached each of `STEPS` (medians from the start)."""
    plain = statistics.median(times["plain"])
    print(f"start-to-ready, {len(times['plain'])} runs per kind (min / median / max)")
    where = {"fake": "the fake cluster in a child process", "real": "the real control plane"}
    clusters = [where[kind] for kind in where if kind in times]
    if clusters:
        print(f"kubernetes on {' and on '.join(clusters)}")
    for name, samples in times.items():
        median = statistics.median(samples)
        spread = "/".join(f"{value * 1000:.0f}" for value in (min(samples), median, max(samples)))
        line = f"{LABELS[name]:27} {spread:>16} ms"
        if name in TARGETS:
            line += f"   ratio to plain {median / plain:.2f} (target <= {TARGETS[name]:.2f})"
        elif name.endswith("-pod"):
            line += f"   ratio to plain {median / plain:.2f}"
        if times.get(f"{name}-pod"):
            pod = statistics.median(times[f"{name}-pod"])
            line += f", to a plain pod {median / pod:.2f}"
        print(line)
    for name, spent in phases.items():
        if spent:
            parts = ", ".join(phase_text(spent.get(p, []), len(times[name]), p) for p in PHASES)
            print(f"  {LABELS[name]} phases (median ms): {parts}")
    for name, seen in steps.items():
        parts = ", ".join(
            f"{step} {statistics.median(seen[step]) * 1000:.0f}"
            + ("" if len(seen[step]) == len(times[name]) else f" (in {len(seen[step])} runs)")
            for step in STEPS
            if seen.get(step)
        )
        print(f"  {LABELS[name]} steps (median ms from the start): {parts}")


def phase_text(samples: list[float], runs: int, phase: str) -> str:
    """A phase's median, and in how many runs its event came if not in every one."""
    if not samples:
        return f"{phase} (no event)"
    text = f"{phase} +{statistics.median(samples) * 1000:.0f}"
    return text if len(samples) == runs else f"{text} (in {len(samples)} of {runs} runs)"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--plane",
        choices=["fake", "real", "both"],
        default="fake",
        help="the kubernetes kind's cluster: the fake one (in a child process), the real "
        "control plane, or both (each a kind of its own)",
    )
    parser.add_argument("--no-kubernetes", action="store_true", help="no kubernetes kind")
    parser.add_argument("--serve-cluster", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_cluster:
        asyncio.run(serve_fake_cluster(args.serve_cluster, QUOTA))
        sys.exit()
    planes = (
        [] if args.no_kubernetes else ["fake", "real"] if args.plane == "both" else [args.plane]
    )
    if "real" in planes and (missing := RealPlane.missing()) is not None:
        print(f"Skipping the real plane: {missing}.", flush=True)
        planes.remove("real")
    compileall.compile_dir(Path(kernel_queue.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory() as data:
        for spec in (PLAIN, QUEUED, KUBE):
            folder = Path(data) / "kernels" / str(spec["display_name"])
            folder.mkdir(parents=True)
            (folder / "kernel.json").write_text(json.dumps(spec))
        os.environ["JUPYTER_PATH"] = data
        os.environ["KERNEL_QUEUE_PRETEND_GPUS"] = "1"
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        asyncio.run(main(args.runs, planes, Path(data)))
