"""kernel-queue: Jupyter kernels that wait in a queue for GPUs, on Kubernetes (Kueue) or locally.

The public surface is small: the provisioner class, the error classes and the version. Imports
are lazy so that `kernel_queue.launcher`, which runs inside kernel images, pulls in nothing
server-side.
"""

from __future__ import annotations

from typing import Any

from kernel_queue._version import __version__

__all__ = [
    "AdmissionTimeout",
    "ConfigError",
    "KernelQueueError",
    "LaunchCancelled",
    "LaunchFailed",
    "NeverFits",
    "PriorityClassNotFound",
    "QueueNotFound",
    "QueuedKernelProvisioner",
    "StartupTimeout",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "QueuedKernelProvisioner":
        from kernel_queue.provisioner import QueuedKernelProvisioner

        return QueuedKernelProvisioner
    if name in __all__:
        from kernel_queue import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'kernel_queue' has no attribute {name!r}")


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """jupyter_server: the extension lives in `kernel_queue.server`."""
    return [{"module": "kernel_queue.server"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """JupyterLab (`jupyter labextension develop`): the prebuilt extension in `labextension/`."""
    return [{"src": "labextension", "dest": "kernel-queue"}]
