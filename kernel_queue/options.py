"""`KernelOptions`: the kernelspec config keys of a queued kernel, as traits.

Shared by the provisioner (jupyter_client ≥ 8) and the Enterprise Gateway 3.x process proxy
(jupyter_client 6), so it imports neither: only traitlets. The values are turned into a
validated `GroupSpec` by `spec.build`; nothing here reads config or the environment at import.
"""

from __future__ import annotations

import os
from typing import Any

from traitlets import Dict, Float, Int, TraitError, Unicode, Union, default
from traitlets.config import LoggingConfigurable


class _Count(Int[int, int]):
    """A non-negative whole number whose type error says how to write it in kernel.json."""

    def error(
        self, obj: Any, value: Any, error: Exception | None = None, info: str | None = None
    ) -> Any:
        raise TraitError(
            f"kernelspec config key '{self.name}' must be a whole number such as 1, "
            f'not {value!r} ({type(value).__name__}); write "{self.name}": 1 without quotes '
            "in kernel.json"
        )


def _quantity(help: str) -> Union:
    return Union(
        [Unicode(), Float(), Int()], default_value=None, allow_none=True, config=True, help=help
    )


class KernelOptions(LoggingConfigurable):
    """Every trait is a kernelspec config key (kernel.json wins over config files)."""

    backend = Unicode(
        config=True,
        help="""Where kernels run: 'local' (this machine) or 'kubernetes'.
        Env: KERNEL_QUEUE_BACKEND.""",
    )
    queue = Unicode("default", config=True, help="The queue (Kueue LocalQueue) to wait in.")
    namespace = Unicode(None, allow_none=True, config=True, help="Kubernetes namespace.")
    image = Unicode(None, allow_none=True, config=True, help="Container image of kernel pods.")
    gpus = _Count(0, config=True, help="GPUs the kernel asks for.")
    gpu_resource = Unicode("nvidia.com/gpu", config=True, help="Extended resource name of a GPU.")
    cpu = _quantity("CPU the kernel asks for, a quantity such as 2 or '500m'.")
    memory = _quantity("Memory the kernel asks for, a quantity such as '8Gi'.")
    priority_class = Unicode(
        None, allow_none=True, config=True, help="Priority class (Kueue WorkloadPriorityClass)."
    )
    pod_group_size = _Count(1, config=True, help="Pods in the kernel's group (kubernetes).")
    pod_template = Dict(config=True, help="Pod fields merged under the ones kernel-queue sets.")
    service_account = Unicode(None, allow_none=True, config=True, help="Pods' service account.")
    connect = Unicode(
        "service",
        config=True,
        help="""kubernetes: connect through the kernel's Service ('service', a stable address
        across pod replacement; the server must reach cluster IPs) or its pod's IP ('pod-ip').""",
    )
    admission_timeout = Float(
        0.0, config=True, help="Seconds to wait in the queue before giving up; 0 waits forever."
    )
    startup_timeout = Float(
        120.0, config=True, help="Seconds from admission until the kernel must be running."
    )
    checkpoint = Dict(
        config=True,
        help="Checkpoint settings: enabled, path or claim, grace_seconds, keep.",
    )

    @default("backend")
    def _backend_from_env(self) -> str:
        return os.environ.get("KERNEL_QUEUE_BACKEND", "local")

    @classmethod
    def keys(cls) -> frozenset[str]:
        """The kernelspec config keys (trait names of this class, not of its subclasses)."""
        return frozenset(KernelOptions.class_own_traits(config=True))
