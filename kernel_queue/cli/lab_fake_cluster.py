"""`jupyter kernel-queue lab --fake-cluster`: JupyterLab on the kubernetes backend, against a
fake Kubernetes cluster with Kueue on this machine, for trying the kubernetes side.

It starts `jupyter kernel-queue fake-cluster --sample-queues` with the checkpoint claim the
kernelspecs name (its own process group, so the terminal's Ctrl-C reaches JupyterLab, which asks
before it stops, and not the cluster), writes those kernelspecs into a temporary Jupyter
data directory put first on `JUPYTER_PATH`, and runs `jupyter lab` with the cluster's kubeconfig.
When JupyterLab ends, the cluster is stopped and the directory removed: nothing stays behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import IO

from kernel_queue.cli.install import kernel_json

CLAIM = "notebook-checkpoints"
QUEUE = "user-queue"
IMAGE = "quay.io/jupyter/scipy-notebook"
"""The kernelspecs' image: the fake kubelet runs every image with this machine's Python."""
STOP_WITHIN = 30.0
"""Seconds the fake cluster has to stop its pods once JupyterLab ended, before it is killed."""


class FakeClusterFailed(RuntimeError):
    """The fake cluster did not start; the message says what it printed."""


KERNELSPECS = (
    ("kq-fake-cluster-gpu", "Python 3 (1 GPU, fake cluster)", 1, "low"),
    ("kq-fake-cluster-2gpu-high", "Python 3 (2 GPUs, high priority, fake cluster)", 2, "high"),
)
"""(name, display name, GPUs, priority class) of the kernelspecs for the sample queues."""


def kernelspecs() -> dict[str, dict[str, object]]:
    """The kernelspecs for the sample queues (2 GPUs; priority classes low and high): a 1-GPU
    kernel that may be preempted, and a 2-GPU one that preempts it; both checkpoint."""
    return {
        name: kernel_json(
            display_name=shown,
            backend="kubernetes",
            queue=QUEUE,
            gpus=gpus,
            image=IMAGE,
            priority_class=priority,
            checkpoint=True,
            checkpoint_claim=CLAIM,
        )
        for name, shown, gpus, priority in KERNELSPECS
    }


def write_kernelspecs(data_dir: Path) -> list[str]:
    """Write `kernelspecs()` under `data_dir/kernels`; return their display names."""
    names = []
    for name, spec in kernelspecs().items():
        folder = data_dir / "kernels" / name
        folder.mkdir(parents=True)
        (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
        names.append(str(spec["display_name"]))
    return names


def start_cluster(kueue: str) -> tuple[subprocess.Popen[str], str, str]:
    """Start the fake cluster; return it, its URL and its kubeconfig path once it serves.
    Its further output is copied to this process's, each line marked as the cluster's."""
    jupyter = str(Path(sys.executable).parent / "jupyter")
    argv = [jupyter, "kernel-queue", "fake-cluster", "--sample-queues", f"--claim={CLAIM}"]
    if kueue:
        argv.append(f"--kueue={kueue}")
    cluster = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # not the terminal's Ctrl-C: stopped after JupyterLab
    )
    assert cluster.stdout is not None
    said: list[str] = []
    url = kubeconfig = ""
    for line in cluster.stdout:
        said.append(line.rstrip())
        if line.startswith("Fake Kubernetes API server with Kueue at "):
            url = line.rsplit(" ", 1)[1].strip()
        elif line.startswith("kubeconfig: "):
            kubeconfig = line.split(": ", 1)[1].strip()
        elif line.startswith("Pods run as processes"):
            break
    if not (url and kubeconfig):
        stop_cluster(cluster)
        shown = "\n  ".join(said[-12:]) or "(nothing)"
        raise FakeClusterFailed(f"the fake cluster did not start; it said:\n  {shown}")
    threading.Thread(target=_copy, args=(cluster.stdout,), daemon=True).start()
    return cluster, url, kubeconfig


def _copy(stream: IO[str]) -> None:
    for line in stream:
        print(f"fake-cluster: {line.rstrip()}", flush=True)


def stop_cluster(cluster: subprocess.Popen[str]) -> None:
    """SIGTERM (the cluster stops its pods), then SIGKILL of its group after STOP_WITHIN."""
    if cluster.poll() is None:
        cluster.terminate()
    try:
        cluster.wait(STOP_WITHIN)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait()


@contextlib.contextmanager
def forwarding_sigterm(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """While JupyterLab runs: SIGTERM is passed on to it, and Ctrl-C is left to it (it asks)."""

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    old_term = signal.signal(signal.SIGTERM, forward)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)


def run(lab_args: list[str], *, kueue: str = "") -> int:
    """JupyterLab against a fresh fake cluster; its exit code once both are gone."""
    print("kernel-queue: starting a fake Kubernetes cluster with Kueue on this machine", flush=True)
    cluster, url, kubeconfig = start_cluster(kueue)
    try:
        with tempfile.TemporaryDirectory(prefix="kernel-queue-lab-") as data:
            shown = write_kernelspecs(Path(data))
            print(
                f"kernel-queue: the kubernetes backend uses the fake cluster at {url}: "
                f"LocalQueue '{QUEUE}' with 8 CPU, 32Gi and 2 nvidia.com/gpu; kernels "
                f"{' and '.join(repr(s) for s in shown)} (the second preempts the first, which "
                "checkpoints and comes back); pods run as processes here\n"
                f"kernel-queue: to look inside: KUBECONFIG={kubeconfig} kubectl get workloads,pods",
                flush=True,
            )
            env = dict(os.environ)
            env["JUPYTER_PATH"] = os.pathsep.join(
                p for p in (data, os.environ.get("JUPYTER_PATH", "")) if p
            )
            argv = [
                sys.executable,
                "-m",
                "jupyterlab",
                f"--KubernetesBackend.kubeconfig={kubeconfig}",
                *lab_args,
            ]
            lab = subprocess.Popen(argv, env=env)
            with forwarding_sigterm(lab):
                return lab.wait()
    finally:
        stop_cluster(cluster)
