"""`jupyter kernel-queue`: the command and its subcommands.

Subcommands live in their own modules (`install.py`, `lab.py`, `status.py`, `park.py`); this
one only dispatches, as `jupyter kernelspec` does.
"""

from __future__ import annotations

import sys
from typing import Any

from jupyter_core.application import JupyterApp

from kernel_queue._version import __version__
from kernel_queue.cli.fake_cluster import FakeClusterApp
from kernel_queue.cli.install import InstallApp
from kernel_queue.cli.lab import LabCommand
from kernel_queue.cli.park import ParkApp, ResumeApp
from kernel_queue.cli.status import StatusApp


class KernelQueueApp(JupyterApp):
    """Queued Jupyter kernels: install kernelspecs, start JupyterLab, show the queue, park and
    resume kernels."""

    name = "jupyter-kernel-queue"
    version = __version__
    description = "Jupyter kernels that wait in a queue for GPUs, locally or on Kueue."
    subcommands = {
        "install": (InstallApp, InstallApp.description.splitlines()[0]),
        "lab": (LabCommand, LabCommand.description.splitlines()[0]),
        "status": (StatusApp, StatusApp.description.splitlines()[0]),
        "park": (ParkApp, ParkApp.description.splitlines()[0]),
        "resume": (ResumeApp, ResumeApp.description.splitlines()[0]),
        "fake-cluster": (FakeClusterApp, FakeClusterApp.description.splitlines()[0]),
    }

    def start(self) -> Any:
        if self.subapp is not None:
            return self.subapp.start()
        print(f"No subcommand given; choose one of: {', '.join(self.subcommands)}\n")
        self.print_subcommands()
        self.exit(1)


def main(argv: list[str] | None = None) -> None:
    """Console script `jupyter-kernel-queue`."""
    KernelQueueApp.launch_instance(argv=argv if argv is not None else sys.argv[1:])
