"""Every exception kernel-queue raises on purpose.

Messages are sentences a notebook user or an admin can act on: they name the kernel (or the
kernelspec), the queue and the next step. jupyter_server shows them in JupyterLab's "Error
Starting Kernel" dialog and in a kernel's `reason`.

    KernelQueueError
    ├── ConfigError (ValueError)             a kernelspec or config value is wrong
    ├── QueueNotFound (LookupError)          the queue named by the kernelspec does not exist
    ├── PriorityClassNotFound (LookupError)  the named priority class does not exist
    ├── NeverFits (ValueError)               the request is larger than the whole quota
    ├── AdmissionTimeout (TimeoutError)      waited longer than `admission_timeout` in the queue
    ├── StartupTimeout (TimeoutError)        admitted, but not running within `startup_timeout`
    ├── LaunchCancelled                      shut down while still waiting in the queue
    └── LaunchFailed (RuntimeError)          the kernel process ended before it was reachable
"""

from __future__ import annotations


class KernelQueueError(Exception):
    """Base class of every error kernel-queue raises on purpose."""


class ConfigError(KernelQueueError, ValueError):
    """A kernelspec or configuration value is invalid; nothing was created."""


class QueueNotFound(KernelQueueError, LookupError):
    """The queue named in the kernelspec does not exist on the backend."""


class PriorityClassNotFound(KernelQueueError, LookupError):
    """The priority class named in the kernelspec does not exist on the backend."""


class NeverFits(KernelQueueError, ValueError):
    """The kernel asks for more than the backend could ever admit."""


class AdmissionTimeout(KernelQueueError, TimeoutError):
    """The kernel waited longer than `admission_timeout` without being admitted."""


class StartupTimeout(KernelQueueError, TimeoutError):
    """The kernel was admitted but did not start within `startup_timeout`."""


class LaunchCancelled(KernelQueueError):
    """The kernel was shut down while it was still waiting in the queue."""


class LaunchFailed(KernelQueueError, RuntimeError):
    """The kernel's process ended before the kernel could be reached."""
