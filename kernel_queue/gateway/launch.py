"""Pure helpers of the Enterprise Gateway process proxy: options, deadlines, error replies.

Imports neither Enterprise Gateway nor jupyter_client, so it is tested in any environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Unicode

from kernel_queue import errors, options
from kernel_queue.options import KernelOptions

EG_PROXY_KEYS = frozenset({"authorized_users", "unauthorized_users", "port_range"})
"""Keys of `metadata.process_proxy.config` that Enterprise Gateway itself reads."""

CLIENT_PATIENCE_ENV = "KERNEL_LAUNCH_TIMEOUT"
"""Seconds the gateway client waits for `POST /api/kernels` (jupyter_server sends it)."""


class GatewayKernelOptions(KernelOptions):
    """The options of one kernel launched by Enterprise Gateway (`c.KernelOptions.<key>` and
    kernel.json apply); `kernel_spec` and `kernel_id` are what `spec.build` reads besides."""

    kernel_spec = AnyTrait()
    kernel_id = Unicode()


def kernel_options(
    kernel_spec: Any, proxy_config: Mapping[str, Any] | None, *, parent: Any, kernel_id: str
) -> GatewayKernelOptions:
    """The kernel's options: `metadata.kernel_provisioner.config` (shared with jupyter_server
    and Kernel Gateway), overridden key by key by `metadata.process_proxy.config`.

    Raises `ConfigError` naming unknown keys or a value of the wrong type.
    """
    metadata = getattr(kernel_spec, "metadata", None) or {}
    shared = dict((metadata.get("kernel_provisioner") or {}).get("config") or {})
    own = {k: v for k, v in (proxy_config or {}).items() if k not in EG_PROXY_KEYS}
    values = {**shared, **own}
    name = getattr(parent, "kernel_name", "") or getattr(kernel_spec, "display_name", "?")
    options.check_keys(
        values,
        where=f"kernelspec {name!r}",
        stanza="metadata.kernel_provisioner.config or metadata.process_proxy.config",
    )
    try:
        return GatewayKernelOptions(
            parent=parent, kernel_spec=kernel_spec, kernel_id=kernel_id, **values
        )
    except Exception as exc:  # traitlets' TraitError: a value of the wrong type
        raise errors.ConfigError(f"kernelspec {name!r}: {exc}") from None


@dataclass(frozen=True)
class QueueDeadline:
    """How long a launch may wait in the queue, and who set that bound."""

    seconds: float  # 0 waits forever
    from_client: bool  # the gateway client's KERNEL_LAUNCH_TIMEOUT, not `admission_timeout`


def queue_deadline(admission_timeout: float, env: Mapping[str, str]) -> QueueDeadline:
    """The kernelspec's `admission_timeout` when set; else the client's patience.

    Enterprise Gateway 3.x answers `POST /api/kernels` only once the kernel runs, and the
    client gives up after its `KERNEL_LAUNCH_TIMEOUT`: waiting longer in the queue would start a
    kernel nobody holds. EG's own launch timeout (`EG_KERNEL_LAUNCH_TIMEOUT`) never bounds it.
    """
    if admission_timeout > 0:
        return QueueDeadline(admission_timeout, from_client=False)
    raw = env.get(CLIENT_PATIENCE_ENV, "")
    try:
        patience = float(raw) if raw else 0.0
    except ValueError:
        patience = 0.0
    return QueueDeadline(max(patience, 0.0), from_client=patience > 0)


def client_gave_up(kernel_id: str, queue: str, waited: float) -> errors.AdmissionTimeout:
    """The error when the queue wait reached the client's KERNEL_LAUNCH_TIMEOUT."""
    return errors.AdmissionTimeout(
        f"kernel {kernel_id} waited {waited:.0f} s in '{queue}' without being admitted, as long "
        f"as the gateway client waits ({CLIENT_PATIENCE_ENV}); it was removed from the queue. "
        "Raise the notebook server's GatewayClient.request_timeout "
        "(JUPYTER_GATEWAY_REQUEST_TIMEOUT) and any proxy timeouts above the expected queue "
        "wait, or set `admission_timeout` in the kernelspec."
    )


def reply(exc: BaseException) -> tuple[int, str, str]:
    """(HTTP status, one-line reason, full message) for a failed launch.

    Kernelspec and queue mistakes are the operator's (500 with the fix); a queue wait that
    ended is 503 (try again later); the message keeps every line (e.g. the pod's log)."""
    message = str(exc) or type(exc).__name__
    status = 503 if isinstance(exc, errors.AdmissionTimeout | errors.LaunchCancelled) else 500
    first = message.splitlines()[0] if message else ""
    return status, first[:400], message
