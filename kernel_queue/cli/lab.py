"""`jupyter kernel-queue lab`: JupyterLab on the local backend, ready to queue kernels.

It reports the GPU inventory the local backend will use; on a machine without an NVIDIA GPU it
turns on a pretend inventory (2 GPUs unless told otherwise) and says so, so the queue can be
tried at once. Then it becomes `jupyter lab` (exec), with any extra arguments passed through.
With `--fake-cluster` it runs JupyterLab on the kubernetes backend against a fake cluster
instead (`cli.lab_fake_cluster`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_core.application import JupyterApp
from traitlets import Bool, Int, Unicode

from kernel_queue.backends.local import gpus as gpu_detection

QUEUED_KERNELSPECS = ("python3-gpu-queued", "python3-cpu-queued")


def inventory_message(found: list[gpu_detection.Gpu], visible: str | None, pretend: int) -> str:
    """What the local backend will offer, in one sentence for the terminal: how many GPUs,
    that a kernel waits while they are in use and that one asking for more fails at once."""
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip()])
        have = f"CUDA_VISIBLE_DEVICES limits the queue to {_gpus(count)}"
    elif found:
        count = len(found)
        names = ", ".join(f"GPU {g.index} ({g.name})" for g in found)
        have = f"{_gpus(count)} found: {names}"
    else:
        count = pretend
        have = (
            f"no NVIDIA GPU found, so the local backend pretends to have {_gpus(count)} "
            "(--pretend-gpus N to change this)"
        )
    return (
        f"kernel-queue: {have}. A kernel waits in the queue while the GPUs it asks for are in "
        f"use; one asking for more than {count} fails at once, saying so."
    )


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


USAGE = """\
Usage: jupyter kernel-queue lab [--pretend-gpus N] [--fake-cluster [--kueue RELEASE]] [ARGS]

Start JupyterLab with queued kernels on the local backend. It first says which GPUs the queue
has: those CUDA_VISIBLE_DEVICES lists, else those the NVIDIA driver reports, else pretend ones.
A kernel waits while the GPUs it asks for are in use; one asking for more than there are fails
at once with a sentence saying so.
  --pretend-gpus N   GPUs the local backend pretends to have when it finds none (default 2;
                     the same as --LocalBackend.pretend_gpus=N)
  --fake-cluster     use the kubernetes backend against a fake Kubernetes cluster with Kueue
                     on this machine (sample queues, 2 GPUs), stopped when JupyterLab ends
  --kueue RELEASE    with --fake-cluster: the Kueue release it is (0.14 needs its CRDs)
  -h, --help         this help
Every other argument goes to `jupyter lab`, e.g. --no-browser --port 8899 (run as root, it
adds --allow-root and says so).
"""


class LabCommand(JupyterApp):
    """Start JupyterLab with queued kernels on the local backend (or a fake cluster)."""

    name = "jupyter-kernel-queue-lab"
    description = __doc__
    pretend_gpus = Int(2, config=True, help="GPUs to pretend to have when none is found.")
    fake_cluster = Bool(False, config=True, help="Run against a fake Kubernetes cluster.")
    kueue = Unicode("", config=True, help="The fake cluster's Kueue release (0.14, 0.19, 0.20).")

    def initialize(self, argv: list[str] | None = None) -> None:
        """Take our options; every other argument is for `jupyter lab`."""
        rest: list[str] = []
        args = list(argv or [])
        while args:
            arg = args.pop(0)
            name, has_value, value = arg.partition("=")
            if name in ("--pretend-gpus", "--kueue") and not has_value and args:
                value, has_value = args.pop(0), "="
            if name == "--pretend-gpus" and has_value:
                self.pretend_gpus = _count(value)
            elif name == "--kueue" and has_value:
                self.kueue = value
            elif arg == "--fake-cluster":
                self.fake_cluster = True
            elif arg in ("-h", "--help"):
                print(USAGE, end="")
                self.exit(0)
            else:
                rest.append(arg)
        self.extra_args = rest

    def start(self) -> Any:
        if self.fake_cluster:
            from kernel_queue.cli import lab_fake_cluster

            try:
                self.exit(lab_fake_cluster.run(self.lab_args(self.extra_args), kueue=self.kueue))
            except lab_fake_cluster.FakeClusterFailed as exc:
                print(f"jupyter kernel-queue lab: {exc}", file=sys.stderr)
                self.exit(2)
        found = gpu_detection.detect()
        print(inventory_message(found, os.environ.get("CUDA_VISIBLE_DEVICES"), self.pretend_gpus))
        specs = KernelSpecManager(parent=self).find_kernel_specs()
        missing = [name for name in QUEUED_KERNELSPECS if name not in specs]
        if missing:
            print(
                f"kernel-queue: kernelspecs {', '.join(missing)} are not installed; reinstall "
                "kernel-queue with pip, or add one with `jupyter kernel-queue install`",
                file=sys.stderr,
            )
        argv = [
            sys.executable,
            "-m",
            "jupyterlab",
            *self.lab_args([f"--LocalBackend.pretend_gpus={self.pretend_gpus}", *self.extra_args]),
        ]
        sys.stdout.flush()
        os.execv(sys.executable, argv)

    @staticmethod
    def lab_args(args: list[str]) -> list[str]:
        """`args` for `jupyter lab`, with --allow-root when running as root (and saying so)."""
        if os.geteuid() == 0 and "--allow-root" not in args:
            # Jupyter refuses root unless told; containers and CI machines often are root.
            print("kernel-queue: running as root, so kernels run as root too (--allow-root)")
            return [*args, "--allow-root"]
        return args


def _count(value: str) -> int:
    """The value of --pretend-gpus, or exit 2 saying what it must be."""
    if value.strip().isdigit():
        return int(value)
    print(
        f"jupyter kernel-queue lab: --pretend-gpus must be a whole number of GPUs (0 or more), "
        f"not {value!r}",
        file=sys.stderr,
    )
    raise SystemExit(2)
