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
    ├── LaunchFailed (RuntimeError)          the kernel process ended before it was reachable
    ├── KueueNotInstalled (LookupError)      the cluster serves no Kueue API
    ├── ClusterApiError                      the Kubernetes API answered with an error status
    │   ├── ClusterNotFound (LookupError)    404
    │   ├── ClusterConflict                  409
    │   ├── ClusterForbidden (PermissionError) 401/403: names the verb and the resource
    │   ├── ClusterGone                      410 (a watch's resourceVersion is too old)
    │   └── ClusterUnavailable (ConnectionError) 5xx, timeouts, refused connections
    ├── ConfigError's kin, defined beside the code that checks them:
    │   ├── launcher.contract.SettingsError (ConfigError)  a launch variable is missing or bad
    │   └── cli.install_checks.InstallError (ConfigError)  an install option is bad; nothing written
    ├── cli.status.StatusError                no running server found, or its API refused us
    └── checkpoint.CheckpointError (RuntimeError)  a checkpoint could not be written or read
        ├── FormatMismatch (ValueError)      written by a format this version cannot read
        └── CheckpointDamaged                its bytes differ from what its manifest recorded

Raised and caught inside kernel-queue, each turned into one of the above or a sentence before
anything reaches a user: `spec.Problem` (one bad kernelspec value, worded per caller),
`quantities.QuantityError` (ValueError), `checkpoint.digests.Mismatch` (read as
CheckpointDamaged), `checkpoint.payloads.DeadlinePassed` (a save out of time stops writing).
`launcher.preemption.Preempted` is a BaseException on purpose: it unwinds the running cell
when the kernel is preempted, past the user's own `except Exception:`.
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
    """The kernel asks for more than the backend could ever admit.

    `has`: what the backend could ever give of the resource that does not fit, where it knows
    ({"gpus": 2}, {"cpu": "16"}); the status event's `has` carries it."""

    def __init__(self, message: str, *, has: dict[str, int | str] | None = None) -> None:
        super().__init__(message)
        self.has = has


class AdmissionTimeout(KernelQueueError, TimeoutError):
    """The kernel waited longer than `admission_timeout` without being admitted."""


class StartupTimeout(KernelQueueError, TimeoutError):
    """The kernel was admitted but did not start within `startup_timeout`."""


class LaunchCancelled(KernelQueueError):
    """The kernel was shut down while it was still waiting in the queue."""


class LaunchFailed(KernelQueueError, RuntimeError):
    """The kernel's process ended before the kernel could be reached."""


class ParkRefused(KernelQueueError):
    """A kernel cannot be parked now (it waits, or saves no checkpoints); nothing changed."""


class KueueNotInstalled(KernelQueueError, LookupError):
    """The cluster serves no Kueue API (its CRDs are not installed)."""


class ClusterApiError(KernelQueueError):
    """The Kubernetes API server answered with an error; `status`, `reason` and `message` are
    taken from its `Status` body. Raised only by `kube/client/api.py`, chained from the client's
    error."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class ClusterNotFound(ClusterApiError, LookupError):
    """404: the object (or the resource type) does not exist."""


class ClusterConflict(ClusterApiError):
    """409: the object exists already, or changed since it was read."""


class ClusterForbidden(ClusterApiError, PermissionError):
    """401 or 403: the server's credentials do not allow the request."""


class ClusterGone(ClusterApiError):
    """410: a watch asked for a resourceVersion the server no longer has."""


class ClusterUnavailable(ClusterApiError, ConnectionError):
    """5xx, a timeout or a refused connection: worth retrying."""
