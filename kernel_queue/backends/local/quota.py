"""The local backend's quota in `admission.py`'s terms: one ClusterQueue with one flavor, the
request a kernel makes of it, and the sentence when a request could never fit.

Pure: built from the backend's settings and inventory, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kernel_queue import admission, errors, quantities
from kernel_queue.machine import protocol
from kernel_queue.model import GroupSpec, short_id

FLAVOR = protocol.FLAVOR


@dataclass(frozen=True)
class LocalQuota:
    """What this machine offers kernels, as `c.LocalBackend` and the GPU inventory say."""

    gpus: int
    cpu: str
    memory: str
    queues: tuple[str, ...]
    priority_classes: Mapping[str, int]
    strategy: str
    preemption: str
    pretend: bool = False  # the GPUs are pretend ones (no GPU found)
    system: bool = False  # the machine's system service sets it (its config), not this server

    @classmethod
    def enforced(cls, machine: protocol.Quota) -> LocalQuota:
        """The quota the machine's system service enforces, from its own config."""
        return cls(
            gpus=len(machine.gpus),
            cpu=f"{machine.cpu}m",
            memory=str(machine.memory),
            queues=machine.queues,
            priority_classes=dict(machine.priority_classes),
            strategy=machine.strategy,
            preemption=machine.preemption,
            pretend=machine.pretend,
            system=True,
        )

    def _setting(self, name: str) -> str:
        """Where `name` is set: this server's config, or the system service's."""
        if self.system:
            return f"`{name}` in the machine's kernel-queue service config (its admin sets it)"
        return f"c.LocalBackend.{name}"

    def cluster_queue(self) -> admission.ClusterQueue:
        """The one ClusterQueue every local queue shares: the machine service's, whose GPUs'
        ids do not matter here, only their number."""
        return self.machine(tuple(str(n) for n in range(self.gpus))).cluster_queue()

    def machine(self, devices: tuple[str, ...]) -> protocol.Quota:
        """This quota as the machine's queue service enforces it (`devices` are the GPU ids)."""
        return protocol.Quota(
            gpus=devices,
            cpu=quantities.millicores(self.cpu),
            memory=quantities.bytes_(self.memory),
            queues=self.queues,
            priority_classes=dict(self.priority_classes),
            strategy=self.strategy,
            preemption=self.preemption,
            pretend=self.pretend,
        )

    def request(self, spec: GroupSpec) -> admission.Request:
        """The kernel's request, named by its kernel id; QueueNotFound or
        PriorityClassNotFound naming the fix. Its `created` is 0: the machine's queue service
        orders arrivals."""
        if spec.queue not in self.queues:
            raise errors.QueueNotFound(
                f"kernel {short_id(spec.kernel_id)}: queue {spec.queue!r} does not exist on the "
                f"local backend; known queues: {', '.join(self.queues)}. Set `queue` in the "
                f"kernelspec to one of them, or add it to {self._setting('queues')}."
            )
        priority = 0
        if spec.priority_class is not None:
            if spec.priority_class not in self.priority_classes:
                known = ", ".join(sorted(self.priority_classes)) or "none"
                raise errors.PriorityClassNotFound(
                    f"kernel {short_id(spec.kernel_id)}: priority class {spec.priority_class!r} "
                    f"does not exist; known classes: {known}. Fix `priority_class` in the "
                    f"kernelspec or add it to {self._setting('priority_classes')}."
                )
            priority = self.priority_classes[spec.priority_class]
        resources = {"gpu": spec.gpus}
        if spec.cpu:
            resources["cpu"] = quantities.millicores(spec.cpu)
        if spec.memory:
            resources["memory"] = quantities.bytes_(spec.memory)
        return admission.Request(
            name=spec.kernel_id,
            queue=spec.queue,
            resources=resources,
            priority=priority,
            created=0.0,
        )

    def check_fits(self, spec: GroupSpec, request: admission.Request) -> None:
        """NeverFits, naming the resource and the fix, if the whole quota is too small."""
        unfit = admission.check_fits_ever(self.cluster_queue(), request)
        if unfit is None:
            return
        who = f"kernel {short_id(spec.kernel_id)}"
        if unfit.resource == "gpu":
            have = f"{self.gpus} pretend GPU(s)" if self.pretend else f"{self.gpus} GPU(s)"
            raise errors.NeverFits(
                f"{who} asks for {spec.gpus} GPU(s) but this machine has {have} in all, so it "
                "could never start. Ask for fewer `gpus` in the kernelspec, or list more with "
                f"{self._setting('gpus')}.",
                has={"gpus": self.gpus},
            )
        if unfit.resource == "cpu":
            raise errors.NeverFits(
                f"{who} asks for {spec.cpu} CPU but the local quota is {self.cpu}, so it could "
                f"never start. Lower `cpu` in the kernelspec or raise {self._setting('cpu')}.",
                has={"cpu": str(self.cpu)},
            )
        raise errors.NeverFits(
            f"{who} asks for {spec.memory} memory but the local quota is "
            f"{quantities.format_bytes(quantities.bytes_(self.memory))}, so it could never "
            f"start. Lower `memory` in the kernelspec or raise {self._setting('memory')}.",
            has={"memory": quantities.format_bytes(quantities.bytes_(self.memory))},
        )
