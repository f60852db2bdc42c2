"""The local backend: Kueue's queue semantics on one workstation.

GPUs (detected from the NVIDIA driver, or configured), CPU and memory are one ClusterQueue with
one flavor; `admission.py` decides who runs, who waits and who is preempted. Each admitted kernel
is the launcher run as a subprocess with `CUDA_VISIBLE_DEVICES` set to its GPUs, on fixed
loopback ports chosen at submit, so a requeued kernel comes back at the same address.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir, jupyter_runtime_dir
from traitlets import Dict, Int, List, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from kernel_queue import admission, errors, launcher, quantities
from kernel_queue.backends import feed, launchers
from kernel_queue.backends import gpus as gpu_detection
from kernel_queue.model import (
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    QueuePlace,
    StopCause,
    short_id,
)

FLAVOR = "local"
_TERMINAL = feed.TERMINAL


@dataclass(eq=False)
class _Group:
    """One submitted kernel as the local backend tracks it."""

    spec: GroupSpec
    ref: GroupRef
    request: admission.Request
    status: GroupStatus
    log_path: Path
    watchers: set[asyncio.Queue[GroupStatus]] = field(default_factory=set)
    admitted: admission.Admitted | None = None
    process: launchers.LauncherProcess | None = None
    task: asyncio.Task[None] | None = None
    evicting: str = ""  # the preemption message while the kernel is being stopped
    saved: str = ""  # what the last preemption's checkpoint saved, as the kernel reported it
    stopping: StopCause | None = None


class LocalBackend(LoggingConfigurable):
    """Queues kernels for this machine's GPUs, CPU and memory; runs them as local launchers.

    Configure it as `c.LocalBackend.<trait>` in a Jupyter server config file.
    """

    name = "local"
    tracks_kernel_restarts = True  # the launcher's status pipe reports every kernel process

    gpus = List(
        Unicode(),
        default_value=None,
        allow_none=True,
        config=True,
        help="""GPU device ids kernels may be given, as CUDA_VISIBLE_DEVICES takes them
        (["0", "1"]). Default: the server's CUDA_VISIBLE_DEVICES if set, else the GPUs the NVIDIA
        driver reports (NVML, then `nvidia-smi -L`), else `pretend_gpus`.""",
    )
    pretend_gpus = Int(
        0,
        config=True,
        help="""On a machine where no GPU is found, pretend to have this many, so the queue can be
        tried. Kernels get CUDA_VISIBLE_DEVICES as if the GPUs existed.
        Env: KERNEL_QUEUE_PRETEND_GPUS.""",
    )
    cpu = Unicode(
        config=True,
        help="CPU quota shared by kernels (a quantity such as '8' or '7500m'). Default: all cores.",
    )
    memory = Unicode(
        config=True,
        help="Memory quota shared by queued kernels (a quantity such as '32Gi'). Default: all RAM.",
    )
    queues = List(
        Unicode(),
        default_value=["default", "gpu", "cpu"],
        config=True,
        help="Names of the queues kernelspecs may name in `queue`; all share this machine's quota.",
    )
    queueing_strategy = Unicode(
        "BestEffortFIFO",
        config=True,
        help="""'BestEffortFIFO' lets a kernel that fits start while an earlier, larger one waits;
        'StrictFIFO' keeps the order strictly (as Kueue's ClusterQueue queueingStrategy).""",
    )
    preemption = Unicode(
        "LowerPriority",
        config=True,
        help="""Whether a waiting kernel may stop running ones to take their GPUs (as Kueue's
        preemption.withinClusterQueue): 'Never', 'LowerPriority' or 'LowerOrNewerEqualPriority'.""",
    )
    priority_classes = Dict(
        value_trait=Int(),
        default_value={"low": -100, "normal": 0, "high": 100},
        config=True,
        help="""Priority values by name, for the kernelspec's `priority_class` (as Kueue's
        WorkloadPriorityClass). A kernel without a class has priority 0.""",
    )
    checkpoint_root = Unicode(
        config=True,
        help="""Where kernels whose kernelspec enables `checkpoint` without a `path` keep their
        checkpoints (<checkpoint_root>/<kernel id>). Default: <Jupyter data dir>/kernel-queue/
        checkpoints.""",
    )
    log_dir = Unicode(
        config=True,
        help="Where each kernel's output is written while it exists (<log_dir>/<group>.log).",
    )

    @default("pretend_gpus")
    def _pretend_from_env(self) -> int:
        return int(os.environ.get("KERNEL_QUEUE_PRETEND_GPUS", "0") or 0)

    @default("cpu")
    def _all_cores(self) -> str:
        return str(os.cpu_count() or 1)

    @default("memory")
    def _all_memory(self) -> str:
        return str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @default("checkpoint_root")
    def _data_checkpoints(self) -> str:
        return str(Path(jupyter_data_dir()) / "kernel-queue" / "checkpoints")

    @default("log_dir")
    def _runtime_log_dir(self) -> str:
        return str(Path(jupyter_runtime_dir()) / "kernel-queue")

    @validate("queueing_strategy")
    def _check_strategy(self, proposal: Any) -> str:
        return str(admission.QueueingStrategy(proposal["value"]))

    @validate("preemption")
    def _check_preemption(self, proposal: Any) -> str:
        return str(admission.PreemptionPolicy(proposal["value"]))

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._groups: dict[str, _Group] = {}
        self._inventory: tuple[str, ...] | None = None
        self._pretend = False
        self._inventory_lock = asyncio.Lock()
        self._arrivals = itertools.count()
        self._checkpoints: dict[
            str, Path
        ] = {}  # kernel id -> checkpoint store to delete at release

    # -- inventory ---------------------------------------------------------------------------

    async def inventory(self) -> tuple[str, ...]:
        """The GPU ids kernels can be given; detected once, off the event loop."""
        async with self._inventory_lock:
            if self._inventory is None:
                self._inventory = await self._find_gpus()
                kind = "pretend " if self._pretend else ""
                self.log.info(
                    "kernel-queue local backend: %d %sGPU(s) %s, %s CPU, %s memory",
                    len(self._inventory),
                    kind,
                    list(self._inventory),
                    self.cpu,
                    quantities.format_bytes(quantities.bytes_(self.memory)),
                )
        return self._inventory

    async def _find_gpus(self) -> tuple[str, ...]:
        if self.gpus is not None:
            return tuple(self.gpus)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return tuple(d.strip() for d in visible.split(",") if d.strip())
        found = await asyncio.to_thread(gpu_detection.detect)
        if found:
            return tuple(gpu.index for gpu in found)
        self._pretend = self.pretend_gpus > 0
        return tuple(str(i) for i in range(self.pretend_gpus))

    def _cluster_queue(self, gpus: int) -> admission.ClusterQueue:
        quota = {
            "gpu": gpus,
            "cpu": quantities.millicores(self.cpu),
            "memory": quantities.bytes_(self.memory),
        }
        return admission.ClusterQueue(
            name=FLAVOR,
            resource_groups=(
                admission.ResourceGroup(frozenset(quota), (admission.Flavor(FLAVOR, quota),)),
            ),
            strategy=admission.QueueingStrategy(self.queueing_strategy),
            preemption=admission.PreemptionPolicy(self.preemption),
        )

    # -- ClusterBackend --------------------------------------------------------------------

    async def submit(self, spec: GroupSpec) -> GroupRef:
        """Queue the kernel (or return the ref of the one already queued or running)."""
        existing = self._groups.get(spec.name)
        if existing is not None:
            return existing.ref
        inventory = await self.inventory()
        request = self._request(spec)
        self._check_fits(spec, request, len(inventory))
        connection = spec.connection
        if not all(connection.ports):
            ports = launchers.free_ports(connection.ip, 5)
            connection = replace(
                connection,
                shell_port=ports[0],
                iopub_port=ports[1],
                stdin_port=ports[2],
                control_port=ports[3],
                hb_port=ports[4],
            )
        ref = GroupRef(self.name, spec.name, spec.kernel_id, connection)
        group = _Group(
            spec=replace(spec, connection=connection),
            ref=ref,
            request=request,
            status=GroupStatus(GroupPhase.QUEUED),
            log_path=self._log_path(spec.name),
        )
        self._groups[spec.name] = group
        directory = self._checkpoint_dir(spec)
        if directory is not None and not spec.checkpoint.keep:
            self._checkpoints[spec.kernel_id] = directory
        self.log.info(
            "kernel %s queued in %r needing %s", short_id(spec.kernel_id), spec.queue, spec.needs()
        )
        self._schedule()
        return ref

    async def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        """Yield the current status, then each change, until the group ends."""
        group = self._groups.get(ref.name)
        if group is None:
            yield GroupStatus(GroupPhase.FINISHED, message="the kernel is gone", exit_code=0)
            return
        async for status in feed.follow(group):
            yield status

    async def stop(self, ref: GroupRef, *, grace: float, cause: StopCause) -> None:
        """Stop the kernel process; a waiting group leaves the queue. RESTART restarts in place."""
        group = self._groups.get(ref.name)
        if group is None:
            return
        if group.process is None:
            if group.admitted is None:
                self._finish(group, 0, "removed from the queue")
            return
        if cause is StopCause.RESTART:
            self._signal(group, signal.SIGHUP)
            return
        group.stopping = cause
        if cause is StopCause.KILL or grace <= 0:
            self._signal(group, signal.SIGKILL)
            return
        # Signal and return, as Popen.terminate does; the launcher is killed if it outlives grace.
        self._signal(group, signal.SIGTERM)
        asyncio.get_running_loop().call_later(grace + 1, group.process.signal, signal.SIGKILL)

    async def send_signal(self, ref: GroupRef, signum: int) -> None:
        """Send `signum` to the launcher, which forwards it to the kernel."""
        group = self._groups.get(ref.name)
        if group is not None:
            self._signal(group, signum)

    async def release(self, ref: GroupRef) -> None:
        """Stop the kernel if it runs, give back its quota, remove its log file."""
        group = self._groups.get(ref.name)
        if group is not None:
            group.stopping = StopCause.SHUTDOWN
            if group.process is not None:
                await self._terminate(group, group.spec.grace_seconds)
            elif group.status.phase not in _TERMINAL:
                self._finish(group, 0, "removed from the queue")
        with contextlib.suppress(FileNotFoundError):
            self._log_path(ref.name).unlink()
        checkpoints = self._checkpoints.pop(ref.kernel_id, None)
        if checkpoints is not None:  # the kernel's own store; kept only when asked to
            await asyncio.to_thread(shutil.rmtree, checkpoints, True)

    async def aclose(self) -> None:
        """Release every group."""
        await asyncio.gather(*(self.release(g.ref) for g in list(self._groups.values())))

    # -- scheduling ------------------------------------------------------------------------

    def _request(self, spec: GroupSpec) -> admission.Request:
        if spec.queue not in self.queues:
            raise errors.QueueNotFound(
                f"kernel {short_id(spec.kernel_id)}: queue {spec.queue!r} does not exist on the "
                f"local backend; known queues: {', '.join(self.queues)}. Set `queue` in the "
                "kernelspec to one of them, or add it to c.LocalBackend.queues."
            )
        priority = 0
        if spec.priority_class is not None:
            if spec.priority_class not in self.priority_classes:
                known = ", ".join(sorted(self.priority_classes)) or "none"
                raise errors.PriorityClassNotFound(
                    f"kernel {short_id(spec.kernel_id)}: priority class {spec.priority_class!r} "
                    f"does not exist; known classes: {known}. Fix `priority_class` in the "
                    "kernelspec or add it to c.LocalBackend.priority_classes."
                )
            priority = self.priority_classes[spec.priority_class]
        resources = {"gpu": spec.gpus}
        if spec.cpu:
            resources["cpu"] = quantities.millicores(spec.cpu)
        if spec.memory:
            resources["memory"] = quantities.bytes_(spec.memory)
        return admission.Request(
            name=spec.name,
            queue=spec.queue,
            resources=resources,
            priority=priority,
            created=float(next(self._arrivals)),
        )

    def _check_fits(self, spec: GroupSpec, request: admission.Request, gpus: int) -> None:
        unfit = admission.check_fits_ever(self._cluster_queue(gpus), request)
        if unfit is None:
            return
        who = f"kernel {short_id(spec.kernel_id)}"
        if unfit.resource == "gpu":
            have = f"{gpus} pretend GPU(s)" if self._pretend else f"{gpus} GPU(s)"
            raise errors.NeverFits(
                f"{who} asks for {spec.gpus} GPU(s) but this machine has {have} in all, so it "
                "could never start. Ask for fewer `gpus` in the kernelspec, or list more with "
                "c.LocalBackend.gpus."
            )
        if unfit.resource == "cpu":
            raise errors.NeverFits(
                f"{who} asks for {spec.cpu} CPU but the local quota is {self.cpu}, so it could "
                "never start. Lower `cpu` in the kernelspec or raise c.LocalBackend.cpu."
            )
        raise errors.NeverFits(
            f"{who} asks for {spec.memory} memory but the local quota is "
            f"{quantities.format_bytes(quantities.bytes_(self.memory))}, so it could never "
            "start. Lower `memory` in the kernelspec or raise c.LocalBackend.memory."
        )

    def _schedule(self) -> None:
        """Run the admission engine over every group and carry out its decision."""
        inventory = self._inventory or ()
        pending = [g.request for g in self._groups.values() if self._is_waiting(g)]
        admitted = [
            replace(g.admitted, evicting=bool(g.evicting))
            for g in self._groups.values()
            if g.admitted is not None
        ]
        decision = admission.schedule(self._cluster_queue(len(inventory)), pending, admitted)
        for preemption in decision.preempt:
            self._evict(self._groups[preemption.victim], self._groups[preemption.preemptor])
        for grant in decision.admit:
            self._admit(self._groups[grant.name], grant)
        for name, position in decision.positions.items():
            group = self._groups[name]
            if self._is_waiting(group):
                place = QueuePlace(group.spec.queue, position.in_queue + 1, position.queue_length)
                status = GroupStatus(GroupPhase.QUEUED, place=place, message=group.saved)
                feed.publish(group, status)

    def _log_path(self, name: str) -> Path:
        return Path(self.log_dir) / f"{name}.log"

    @staticmethod
    def _is_waiting(group: _Group) -> bool:
        return group.admitted is None and group.status.phase not in _TERMINAL

    def _busy_devices(self) -> set[str]:
        return {d for g in self._groups.values() if g.admitted for d in g.status.devices}

    def _admit(self, group: _Group, grant: admission.Admission) -> None:
        busy = self._busy_devices()
        free = [d for d in self._inventory or () if d not in busy]
        devices = tuple(free[: group.spec.gpus])
        group.admitted = admission.Admitted(group.request, grant.flavors, time.monotonic())
        feed.publish(group, GroupStatus(GroupPhase.ADMITTED, flavor=FLAVOR, devices=devices))
        self.log.info("kernel %s admitted with GPUs %s", short_id(group.spec.kernel_id), devices)
        group.task = asyncio.get_running_loop().create_task(self._run(group))

    def _evict(self, victim: _Group, preemptor: _Group) -> None:
        needs = preemptor.spec.needs()
        klass = preemptor.spec.priority_class
        by = f"kernel {short_id(preemptor.spec.kernel_id)}" + (
            f" (priority {klass!r})" if klass else ""
        )
        victim.evicting = f"preempted by higher-priority {by}, which needs {needs}"
        self.log.info("kernel %s %s", short_id(victim.spec.kernel_id), victim.evicting)
        feed.publish(
            victim, victim.status.evolve(phase=GroupPhase.EVICTED, message=victim.evicting)
        )
        self._signal(victim, signal.SIGTERM)

    # -- processes -------------------------------------------------------------------------

    async def _run(self, group: _Group) -> None:
        """Start the group's launcher and settle the group when it exits."""
        spec = group.spec
        request = launchers.LaunchRequest(
            kernel_id=spec.kernel_id,
            argv=spec.argv,
            env={**spec.env, **self._checkpoint_env(spec)},
            cwd=spec.cwd,
            connection=group.ref.connection,
            devices=group.status.devices,
            stop_timeout=spec.grace_seconds,
            log_path=group.log_path,
        )
        group.process = launchers.LauncherProcess(lambda e: self._on_launcher_event(group, e))
        try:
            code = await group.process.run(request)
        except OSError as exc:
            group.process = None
            self._finish(group, None, f"could not start the kernel launcher: {exc}", failed=True)
            return
        group.process = None
        self._on_exit(group, code)

    def _checkpoint_dir(self, spec: GroupSpec) -> Path | None:
        if not spec.checkpoint.enabled:
            return None
        return Path(spec.checkpoint.path or self.checkpoint_root) / spec.kernel_id

    def _checkpoint_env(self, spec: GroupSpec) -> dict[str, str]:
        """The kernel's checkpoint store and save deadline (the launcher's stop timeout is the
        whole grace period; the save ends a little earlier so the kernel can report and exit)."""
        directory = self._checkpoint_dir(spec)
        if directory is None:
            return {}
        env = {
            launcher.ENV_CHECKPOINT_DIR: str(directory),
            launcher.ENV_CHECKPOINT_DEADLINE: str(launcher.checkpoint_deadline(spec.grace_seconds)),
        }
        if spec.checkpoint.keep:
            env[launcher.ENV_CHECKPOINT_KEEP] = "1"
        return env

    def _on_launcher_event(self, group: _Group, event: dict[str, Any]) -> None:
        if event.get("event") == "checkpoint":
            group.saved = str(event.get("summary") or "")
            self.log.info("kernel %s: %s", short_id(group.spec.kernel_id), group.saved)
            return
        status = group.status
        if event.get("event") == "started" and not group.evicting:
            group.saved = ""
            feed.publish(
                group,
                status.evolve(
                    phase=GroupPhase.RUNNING,
                    message="",
                    generation=int(event.get("generation", 0)),
                    kernel_alive=True,
                ),
            )
        elif event.get("event") == "exited" and not group.evicting:
            feed.publish(group, status.evolve(kernel_alive=False))

    def _on_exit(self, group: _Group, code: int) -> None:
        if group.evicting:
            self.log.info(
                "kernel %s stopped after preemption; requeued", short_id(group.spec.kernel_id)
            )
            group.evicting = ""
            group.admitted = None
            # Back of the line, as Kueue requeues by eviction time; `_schedule` publishes the place.
            group.request = replace(group.request, created=float(next(self._arrivals)))
            group.status = GroupStatus(GroupPhase.QUEUED, message=group.saved)
            self._schedule()
            return
        if group.stopping is None and group.status.phase is GroupPhase.ADMITTED:
            message = f"the kernel exited with code {code} before it started"
            self._finish(group, code, message + launchers.log_tail(group.log_path), failed=True)
            return
        self._finish(group, code, f"the kernel exited with code {code}")

    def _finish(
        self, group: _Group, code: int | None, message: str, *, failed: bool = False
    ) -> None:
        """End the group: free its quota, tell watchers, forget it, admit the next."""
        phase = GroupPhase.FAILED if failed else GroupPhase.FINISHED
        self._groups.pop(group.spec.name, None)
        group.admitted = None
        feed.publish(group, GroupStatus(phase, message=message, exit_code=code))
        self._schedule()

    def _signal(self, group: _Group, signum: int) -> None:
        if group.process is not None:
            group.process.signal(signum)

    async def _terminate(self, group: _Group, grace: float) -> None:
        """SIGTERM the launcher (it stops the kernel), SIGKILL it after `grace` seconds."""
        if group.process is None:
            return
        self._signal(group, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        process = group.process
        try:
            await asyncio.wait_for(process.exited.wait(), timeout=max(grace, 0) + 1)
        except TimeoutError:
            process.signal(signal.SIGKILL)
            await process.exited.wait()
