"""The clusters a benchmark's kernels run on, outside the benchmark's process.

The fake cluster: the benchmark script runs itself with `--serve-cluster ROOT`: that child
starts the cluster, prints its kubeconfig path, then answers each line on its stdin with one
line (JSON by each script's convention) and stops at the end of its input. `ClusterProcess`
starts it, asks it, stops it; `serve_fake_cluster` is such a child for a script that needs
nothing but the cluster. The real control plane (`RealPlane`): kube-apiserver, etcd, Kueue and
the node agent, each a process of its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STOP_WITHIN = 30.0
"""Seconds the child has to stop after its input ends, before it is killed."""


class ClusterProcess:
    """The child process serving the fake cluster for `script`."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, root: Path) -> str:
        """Start the process; return its kubeconfig path once it serves."""
        pipe = asyncio.subprocess.PIPE
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, self.script, "--serve-cluster", str(root), stdin=pipe, stdout=pipe
        )
        try:
            line = await asyncio.wait_for(self._stdout().readline(), 60)
            if not line:
                raise RuntimeError("the fake cluster process ended before it served")
        except BaseException:
            await self.stop()
            raise
        return line.decode().strip()

    async def ask(self, line: str) -> str:
        """Send one line; its one-line answer."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        return (await self._stdout().readline()).decode()

    async def stats(self) -> dict[str, Any]:
        """The child's JSON answer to `stats`, its `requests` ([verb, resource, count] triples)
        as a Counter by (verb, resource)."""
        answer: dict[str, Any] = json.loads(await self.ask("stats"))
        answer["requests"] = collections.Counter({(v, r): n for v, r, n in answer["requests"]})
        return answer

    async def stop(self) -> None:
        """End of input stops the cluster; kill it if it has not ended within STOP_WITHIN."""
        if self.proc is None:
            return
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_WITHIN)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def _stdout(self) -> asyncio.StreamReader:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout


async def serve_fake_cluster(root: str, quota: Mapping[str, str | int]) -> None:
    """The child's part for a script that asks nothing of the cluster but to serve: a
    `FakeCluster` (Kueue admitting at once, its kubelet running the pods here) with `quota` in
    `setup_queues`; prints its kubeconfig (the admin's, as the fake's tests use), then answers
    each line with its request counts as `ClusterProcess.stats` reads them; stops at the end of
    its input."""
    from kernel_queue_fake_cluster.cluster import FakeCluster

    cluster = FakeCluster(root_dir=root)
    await cluster.start()
    try:
        cluster.setup_queues(quota=dict(quota))
        print(cluster.kubeconfig, flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            requests = [[*key, n] for key, n in cluster.stats.requests.items()]
            print(json.dumps({"requests": requests, "time": time.monotonic()}), flush=True)
    finally:
        await cluster.stop()


def queues(quota: Mapping[str, str | int]) -> list[dict[str, Any]]:
    """The project's sample queues (`jupyter kernel-queue fake-cluster`'s, etc/kubernetes/
    queues.yaml's: ResourceFlavor `default-flavor`, ClusterQueue `cluster-queue`, LocalQueue
    `user-queue` in namespace default, the priority classes) with `quota` for the ClusterQueue."""
    from kernel_queue.cli.fake_cluster import sample_queue_objects

    objects: list[dict[str, Any]] = sample_queue_objects()  # made anew at each call
    for queue in objects:
        if queue["kind"] == "ClusterQueue":
            group = queue["spec"]["resourceGroups"][0]
            group["coveredResources"] = list(quota)
            group["flavors"][0]["resources"] = [
                {"name": name, "nominalQuota": amount} for name, amount in quota.items()
            ]
    return objects


class RealPlane:
    """The real control plane (`kernel_queue_fake_cluster.control_plane`): kube-apiserver, etcd,
    kube-scheduler, kube-controller-manager, Kueue 0.19 and the node agent, which runs each pod
    as a process here with the image's `image_paths` directory first on its PATH. The server
    authenticates as etc/kubernetes/rbac.yaml's service account `kernel-queue` of namespace
    default, straight to the API server (`control.kubeconfig_for`)."""

    def __init__(self) -> None:
        self.control: Any = None
        self.token = ""

    @staticmethod
    def missing() -> str | None:
        """Words saying the plane is not built and how to build it; None when it is built."""
        from kernel_queue_fake_cluster.control_plane import build

        if build.built() is not None:
            return None
        return (
            "the real control plane is not built (`python -m kernel_queue_fake_cluster."
            "control_plane built` exits 1): build it with `scripts/control-plane build` (about "
            "17 min the first time)"
        )

    async def start(
        self,
        root: Path,
        *,
        node: Any = None,
        queues: list[dict[str, Any]] | None = None,
        label_keys_to_copy: tuple[str, ...] = (),
    ) -> str:
        """Start the plane under `root` with `node` (a `NodeSpec`), apply RBAC and `queues`;
        the server's kubeconfig path."""
        import yaml
        from kernel_queue_fake_cluster.control_plane.plane import ControlPlane

        plane = ControlPlane(
            kueue="0.19", root=root / "plane", node=node, label_keys_to_copy=label_keys_to_copy
        )
        self.control = await asyncio.to_thread(plane.start)
        admin = self.control.admin
        rbac = (REPO / "etc" / "kubernetes" / "rbac.yaml").read_text()
        await asyncio.to_thread(admin.apply, [d for d in yaml.safe_load_all(rbac) if d])
        if queues:
            await asyncio.to_thread(admin.apply, queues)
        self.token = await asyncio.to_thread(
            self.control.service_account_token, "default", "kernel-queue"
        )
        return str(self.control.kubeconfig_for(self.token, name="server-kubeconfig"))

    async def stop(self) -> None:
        if self.control is not None:
            await asyncio.to_thread(self.control.stop)
            self.control = None
