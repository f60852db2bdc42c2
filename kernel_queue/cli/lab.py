"""`jupyter kernel-queue lab`: JupyterLab on the local backend, ready to queue kernels.

It reports the GPU inventory the local backend will use; on a machine without an NVIDIA GPU it
turns on a pretend inventory (2 GPUs unless told otherwise) and says so, so the queue can be
tried at once. Then it becomes `jupyter lab` (exec), with any extra arguments passed through.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_core.application import JupyterApp
from traitlets import Int

from kernel_queue.backends import gpus as gpu_detection

QUEUED_KERNELSPECS = ("python3-gpu-queued", "python3-cpu-queued")


def inventory_message(found: list[gpu_detection.Gpu], visible: str | None, pretend: int) -> str:
    """What the local backend will offer, in one sentence for the terminal."""
    if visible is not None:
        devices = [d for d in visible.split(",") if d.strip()]
        return f"kernel-queue: CUDA_VISIBLE_DEVICES limits the queue to {len(devices)} GPU(s)"
    if found:
        names = ", ".join(f"GPU {g.index} ({g.name})" for g in found)
        return f"kernel-queue: {len(found)} GPU(s) found: {names}"
    return (
        f"kernel-queue: no NVIDIA GPU found, so the local backend pretends to have {pretend} "
        "GPUs; kernels asking for more wait in the queue (set --pretend-gpus to change this)"
    )


class LabCommand(JupyterApp):
    """Start JupyterLab with queued kernels on the local backend.

    Extra arguments go to `jupyter lab`, e.g. jupyter kernel-queue lab --no-browser --port 8899
    """

    name = "jupyter-kernel-queue-lab"
    description = __doc__
    pretend_gpus = Int(2, config=True, help="GPUs to pretend to have when none is found.")

    def initialize(self, argv: list[str] | None = None) -> None:
        """Take `--pretend-gpus N`; every other argument is for `jupyter lab`."""
        rest: list[str] = []
        args = list(argv or [])
        while args:
            arg = args.pop(0)
            if arg == "--pretend-gpus" and args:
                self.pretend_gpus = int(args.pop(0))
            elif arg.startswith("--pretend-gpus="):
                self.pretend_gpus = int(arg.split("=", 1)[1])
            elif arg in ("-h", "--help"):
                self.print_help()
                self.exit(0)
            else:
                rest.append(arg)
        self.extra_args = rest

    def start(self) -> Any:
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
            f"--LocalBackend.pretend_gpus={self.pretend_gpus}",
            *self.extra_args,
        ]
        if os.geteuid() == 0 and "--allow-root" not in argv:
            # Jupyter refuses root unless told; containers and CI machines often are root.
            print("kernel-queue: running as root, so kernels run as root too (--allow-root)")
            argv.append("--allow-root")
        sys.stdout.flush()
        os.execv(sys.executable, argv)
