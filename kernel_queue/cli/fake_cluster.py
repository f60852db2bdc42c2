"""`jupyter kernel-queue fake-cluster`: serve the fake Kubernetes + Kueue on localhost.

For trying the kubernetes backend without a cluster: it prints a kubeconfig path and the
commands to set up sample queues, then serves until interrupted. Pods run as local processes.
`--kueue RELEASE` makes it one Kueue release (0.14, 0.19 or 0.20: the API versions, visibility
API and reasons of that release), whose CRDs `--crds` must then give.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from jupyter_core.application import JupyterApp
from traitlets import Bool, Int, List, Unicode

SAMPLE_QUEUES = """\
Sample queues: 1 flavor, a ClusterQueue with 8 CPU, 32Gi and 2 nvidia.com/gpu, the LocalQueue
'user-queue' in namespace 'default', and priority classes 'low' (100) and 'high' (1000):
"""


class FakeClusterApp(JupyterApp):
    """Serve a fake Kubernetes API server with Kueue and a kubelet on 127.0.0.1.

    Example: jupyter kernel-queue fake-cluster --port 8001 --sample-queues
    """

    name = "jupyter-kernel-queue-fake-cluster"
    description = __doc__
    port = Int(0, config=True, help="Port to listen on (0: any free port).")
    directory = Unicode(
        "", config=True, help="Where the cluster keeps its files (default: a temporary directory)."
    )
    crds = Unicode(
        "",
        config=True,
        help="Kueue's CRDs: a directory of CRD files, or the manifests.yaml of a Kueue release "
        "(default: $KERNEL_QUEUE_FAKE_CLUSTER_CRDS).",
    )
    kueue = Unicode(
        "",
        config=True,
        help="The Kueue release to be: 0.14, 0.19 or 0.20, each with its API versions, "
        "visibility API and reasons; the CRDs must be that release's, 0.19's for 0.20 (default: "
        "0.19, or 0.14 for CRDs that serve v1beta1 only).",
    )
    sample_queues = Bool(False, config=True, help="Create the sample queues at start.")
    claims = List(
        Unicode(),
        config=True,
        help="PersistentVolumeClaims (ReadWriteMany) to create in namespace 'default' at start, "
        "e.g. for the checkpoints of a kernelspec's `checkpoint.claim`.",
    )
    aliases = {
        **JupyterApp.aliases,
        "port": "FakeClusterApp.port",
        "dir": "FakeClusterApp.directory",
        "crds": "FakeClusterApp.crds",
        "kueue": "FakeClusterApp.kueue",
        "claim": "FakeClusterApp.claims",
    }
    flags = {
        **JupyterApp.flags,
        "sample-queues": ({"FakeClusterApp": {"sample_queues": True}}, "Create sample queues."),
    }

    def start(self) -> None:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(self._serve())

    async def _serve(self) -> None:
        try:
            from kernel_queue_fake_cluster.apiserver import crds as crd_files
            from kernel_queue_fake_cluster.cluster import FakeCluster
        except ModuleNotFoundError as exc:
            if exc.name != "kernel_queue_fake_cluster":
                raise
            from kernel_queue.testing import NOT_INSTALLED

            print(f"jupyter kernel-queue fake-cluster: {NOT_INSTALLED}", file=sys.stderr)
            self.exit(2)
        import yaml  # a dependency of the fake cluster

        from kernel_queue.kube import kueue

        crds = self.crds or None  # unset: the fake reads $KERNEL_QUEUE_FAKE_CLUSTER_CRDS
        try:
            crd_files.load(crds)  # read once here (cached), so a missing source stops us first
            # An unknown release or CRDs of another one (ValueErrors) stop us here too.
            cluster = FakeCluster(
                root_dir=Path(self.directory) if self.directory else None,  # None: a temporary one
                crds=crds,
                port=self.port,
                kueue=self.kueue or True,
                label_keys_to_copy=(kueue.OWNER_LABEL,),  # as the README asks of Kueue
            )
        except (crd_files.CrdsNotFound, ValueError) as exc:
            print(f"jupyter kernel-queue fake-cluster: {exc}", file=sys.stderr)
            self.exit(2)
        root = cluster.root
        await cluster.start()
        samples = cluster.for_release(sample_queue_objects())
        queues = root / "sample-queues.yaml"
        queues.write_text(yaml.safe_dump_all(samples, sort_keys=False))
        if self.sample_queues:
            cluster.apply(samples)
        cluster.apply(claim_object(name) for name in self.claims)
        print(f"Fake Kubernetes API server with Kueue at {cluster.url}")
        if cluster.release is not None:
            release = cluster.release
            print(
                f"Kueue {release.name}: kueue.x-k8s.io {', '.join(release.served)}, "
                f"visibility.kueue.x-k8s.io {', '.join(release.visibility)}"
            )
        print(f"kubeconfig: {cluster.kubeconfig}\n")
        print(f"  export KUBECONFIG={cluster.kubeconfig}")
        print("  kubectl get pods -A")
        if not self.sample_queues:
            print(f"\n{SAMPLE_QUEUES}\n  kubectl apply -f {queues}")
        print("\nPods run as processes on this machine. Press Ctrl-C to stop.", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await cluster.stop()


def claim_object(name: str) -> dict[str, object]:
    """A ReadWriteMany PersistentVolumeClaim `name` in namespace 'default'."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }


def sample_queue_objects() -> list[dict[str, object]]:
    """The sample ResourceFlavor, ClusterQueue, LocalQueue and WorkloadPriorityClasses: the same
    objects as etc/kubernetes/queues.yaml (a test keeps them equal), here for installed copies."""
    v = "kueue.x-k8s.io/v1beta2"
    return [
        {"apiVersion": v, "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}},
        {
            "apiVersion": v,
            "kind": "ClusterQueue",
            "metadata": {"name": "cluster-queue"},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "default-flavor",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 8},
                                    {"name": "memory", "nominalQuota": "32Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": 2},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": v,
            "kind": "LocalQueue",
            "metadata": {"name": "user-queue", "namespace": "default"},
            "spec": {"clusterQueue": "cluster-queue"},
        },
        {
            "apiVersion": v,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "low"},
            "value": 100,
            "description": "Kernels that may be preempted.",
        },
        {
            "apiVersion": v,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "high"},
            "value": 1000,
            "description": "Kernels that may preempt low-priority ones.",
        },
    ]
