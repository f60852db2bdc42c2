"""A queued kernel as server/ sees it: the one place that tells our kernels from others.

jupyter_server's kernel manager holds one jupyter_client `KernelManager` (`km`) per kernel; its
`provisioner` is ours (`provisioner.QueuedKernelProvisioner`) for a queued kernelspec, another
one (jupyter_client's `LocalProvisioner`) or none yet otherwise. `provisioner_of` checks that
once, and everything else in server/ takes the typed result: the kernel's `KernelSession`
(`session_of`, None before its first launch made one), or the provisioner's own few members
(`QueuedProvisioner`).

server/ may not import `provisioner.py` (the front ends are independent of each other: the
import contracts in pyproject.toml), so what it needs of the provisioner is this protocol, and
tests/server/test_kernels.py holds the provisioner to it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from kernel_queue.session import KernelSession

REFUSAL = "kernel_queue_refusal"
"""The kernel manager attribute holding the failed status of a kernel whose provisioner could
not be made (`kernelmanager.QueuedMappingKernelManager._refused`); `queue_status` reads it."""


@runtime_checkable
class QueuedProvisioner(Protocol):
    """What server/ uses of `QueuedKernelProvisioner` beyond its session."""

    park_after: float
    """Seconds idle before the kernel is parked (0: never), as its kernelspec says."""
    namespace: str | None
    """The kubernetes namespace its kernelspec names (None: the backend's)."""

    @property
    def kernel_session(self) -> KernelSession | None:
        """The kernel's session, made by its first launch (or a reattach)."""

    @property
    def refusal(self) -> dict[str, Any] | None:
        """The failed status of a kernelspec config refused before a session was made."""

    async def cancel_launch(self) -> None:
        """Shut down a kernel that has not started yet, at any step of its launch."""


def provisioner_of(km: Any) -> QueuedProvisioner | None:
    """The kernel's provisioner if it is a queued one (None: another kind, or none yet)."""
    provisioner = getattr(km, "provisioner", None)  # None until the start makes it
    return provisioner if isinstance(provisioner, QueuedProvisioner) else None


def session_of(km: Any) -> KernelSession | None:
    """The queued kernel's session; None for another kind of kernel or before its first launch."""
    provisioner = provisioner_of(km)
    return provisioner.kernel_session if provisioner is not None else None


def park_after(km: Any) -> float:
    """The kernel's `park_after` (s); 0 for kernels that never park."""
    provisioner = provisioner_of(km)
    return float(provisioner.park_after or 0) if provisioner is not None else 0.0


def queue_status(km: Any) -> dict[str, Any] | None:
    """The kernel's queue state, as in status events (its session's; its refusal when its
    kernelspec config was refused); None for a kernel of another provisioner."""
    provisioner = provisioner_of(km)
    if provisioner is None:  # also ours, refused before its provisioner could be made
        refusal: dict[str, Any] | None = getattr(km, REFUSAL, None)
        return refusal
    session = provisioner.kernel_session
    return session.queue_status() if session is not None else provisioner.refusal


def refused(km: Any, status: dict[str, Any]) -> None:
    """Keep the failed `status` of a kernel whose provisioner could not be made."""
    setattr(km, REFUSAL, status)
