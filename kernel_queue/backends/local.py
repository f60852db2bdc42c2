"""The local backend: Kueue's queue semantics on one workstation.

GPUs (detected from the NVIDIA driver, or configured), CPU and memory are one ClusterQueue with
one flavor; `admission.py` decides who runs, who waits and who is preempted. Each admitted kernel
is the launcher run as a subprocess with `CUDA_VISIBLE_DEVICES` set to its GPUs, on loopback
ports chosen and held at submit (`ports.py`), so a requeued kernel comes back at the same address.
Groups are keyed by the whole kernel id; `records.py` notes what each kernel left on disk.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir, jupyter_runtime_dir
from traitlets import Dict, Float, Int, List, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from kernel_queue import admission, errors, ids, quantities
from kernel_queue import spec as kernelspecs
from kernel_queue.backends import feed, launchers, quota, records
from kernel_queue.backends import gpus as gpu_detection
from kernel_queue.backends import ports as held_ports
from kernel_queue.kube import tasks
from kernel_queue.launcher import contract
from kernel_queue.model import (
    ConnectionInfo,
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    QueuePlace,
    StopCause,
    group_name,
    short_id,
)

_TERMINAL = feed.TERMINAL


@dataclass(eq=False)
class _Group:
    """One submitted kernel as the local backend tracks it."""

    spec: GroupSpec
    ref: GroupRef
    request: admission.Request
    status: GroupStatus
    log_path: Path
    ports: held_ports.HeldPorts
    watchers: set[asyncio.Queue[GroupStatus]] = field(default_factory=set)
    admitted: admission.Admitted | None = None
    process: launchers.LauncherProcess | None = None
    task: asyncio.Task[None] | None = None
    evicting: str = ""  # the preemption message while the kernel is being stopped
    saved: str = ""  # what the last preemption's checkpoint saved, as the kernel reported it
    stopping: StopCause | None = None
    launches: int = 0  # launchers started so far (a later one resumes the kernel)


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

    reap_interval = Float(
        600.0,
        config=True,
        help="""Seconds between two looks (at a kernel's submit) for what a Jupyter server of
        this user that died left behind: its kernels' logs and checkpoints are deleted once its
        launchers are gone too. The first submit always looks.""",
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
        # kernel id -> its checkpoint store and the root it lies in, deleted at release
        self._checkpoints: dict[str, tuple[Path, Path]] = {}
        self._closed = False
        self._tasks = tasks.Tasks(self.log)  # each admitted kernel's run, its kill after grace
        self._ledger = records.Ledger(
            Path(jupyter_runtime_dir()) / "kernel-queue" / "kernels", self.log
        )

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

    def _quota(self) -> quota.LocalQuota:
        return quota.LocalQuota(
            gpus=len(self._inventory or ()),
            cpu=self.cpu,
            memory=self.memory,
            queues=tuple(self.queues),
            priority_classes=dict(self.priority_classes),
            strategy=self.queueing_strategy,
            preemption=self.preemption,
            pretend=self._pretend,
        )

    # -- ClusterBackend --------------------------------------------------------------------

    async def submit(self, spec: GroupSpec) -> GroupRef:
        """Queue the kernel (or return the ref of the one already queued or running).

        The group is keyed and named by the whole kernel id (a lowercase UUID, else refused);
        an id that another live server of this user runs is refused too (their log and
        checkpoint paths would be shared).
        """
        kernel_id = ids.check(spec.kernel_id)
        who = f"kernel {short_id(kernel_id)}"
        existing = self._groups.get(kernel_id)
        if existing is not None:
            return existing.ref
        self._check_open(who)
        spec = replace(spec, name=group_name(kernel_id))
        await self.inventory()
        limits = self._quota()
        request = limits.request(spec, created=float(next(self._arrivals)))
        limits.check_fits(spec, request)
        checkpoints = self._checkpoint_dir(spec)
        if checkpoints is not None and not spec.checkpoint.path:
            await self._check_checkpoint_root(who)
        owned = None if checkpoints is None or spec.checkpoint.keep else checkpoints
        log_path = self._log_path(spec.name)
        self._ledger.reap_soon(self.reap_interval)
        other = await self._ledger.claim(
            kernel_id, log_path=log_path, checkpoints=owned, root=self._root(spec)
        )
        if other is not None:
            raise errors.LaunchFailed(
                f"{who}: another Jupyter server of this user (pid {other.server.pid}) runs a "
                f"kernel with the id {kernel_id}, and the two would share its log and "
                "checkpoints; start the kernel without choosing an id."
            )
        existing = self._groups.get(kernel_id)  # submitted again while this one waited
        if existing is not None:
            return existing.ref
        self._check_open(who)
        ports = self._hold_ports(spec)
        connection = replace(
            spec.connection,
            shell_port=ports.ports[0],
            iopub_port=ports.ports[1],
            stdin_port=ports.ports[2],
            control_port=ports.ports[3],
            hb_port=ports.ports[4],
        )
        ref = GroupRef(self.name, spec.name, kernel_id, connection)
        group = _Group(
            spec=replace(spec, connection=connection),
            ref=ref,
            request=request,
            status=GroupStatus(GroupPhase.QUEUED),
            log_path=log_path,
            ports=ports,
        )
        self._groups[kernel_id] = group
        if owned is not None:
            self._checkpoints[kernel_id] = (owned, self._root(spec))
        self.log.info("%s queued in %r needing %s", who, spec.queue, spec.needs())
        self._schedule()
        return ref

    async def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        """Yield the current status, then each change, until the group ends."""
        group = self._find(ref)
        if group is None:
            yield GroupStatus(GroupPhase.FINISHED, message="the kernel is gone", exit_code=0)
            return
        async for status in feed.follow(group):
            yield status

    async def stop(self, ref: GroupRef, *, grace: float, cause: StopCause) -> None:
        """Stop the kernel process; a waiting group leaves the queue. RESTART restarts in place."""
        group = self._find(ref)
        if group is None:
            return
        if group.process is None:
            if cause is not StopCause.RESTART:
                group.stopping = cause  # admitted but not started yet: `_run` will not start it
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
        kill_after = grace + contract.LOCAL_KILL_MARGIN_SECONDS
        self._tasks.spawn(_kill_after(group.process, kill_after), f"kill {group.spec.name}")

    async def send_signal(self, ref: GroupRef, signum: int) -> None:
        """Send `signum` to the launcher, which forwards it to the kernel."""
        group = self._find(ref)
        if group is not None:
            self._signal(group, signum)

    async def release(self, ref: GroupRef) -> None:
        """Stop the kernel if it runs, give back its quota and ports, remove its files.

        Whatever the group is doing (queued, starting, running, being preempted), it ends here
        and never starts again."""
        if not ids.is_valid(ref.kernel_id):
            return  # never submitted here: nothing of ours is named after it
        group = self._find(ref)
        if group is not None:
            group.stopping = StopCause.SHUTDOWN
            if group.process is not None:
                await self._terminate(group, group.spec.grace_seconds)
            if self._groups.get(ref.kernel_id) is group:  # waiting, or admitted but not started
                self._finish(group, 0, "removed from the queue")
        elif ref.kernel_id in self._groups:
            return  # a newer group of the same kernel owns the files now
        checkpoints, root = self._checkpoints.pop(ref.kernel_id, (None, None))
        await self._ledger.forget(
            ref.kernel_id,
            log_path=self._log_path(group_name(ref.kernel_id)),
            checkpoints=checkpoints,
            root=root,
        )

    async def aclose(self) -> None:
        """Release every group, then end every task this backend started and wait for its
        records; nothing is admitted or submitted afterwards."""
        self._closed = True
        await asyncio.gather(*(self.release(g.ref) for g in list(self._groups.values())))
        await self._tasks.aclose()
        await self._ledger.aclose()

    def _find(self, ref: GroupRef) -> _Group | None:
        """The group `ref` names: same kernel id, same launch (a later one has other ports)."""
        group = self._groups.get(ref.kernel_id)
        return group if group is not None and group.ref == ref else None

    def _check_open(self, who: str) -> None:
        if self._closed:
            raise errors.LaunchFailed(f"{who}: the server is shutting down; start it again later")

    def _hold_ports(self, spec: GroupSpec) -> held_ports.HeldPorts:
        ip = spec.connection.ip
        try:
            return held_ports.HeldPorts.new(ip)
        except OSError as exc:  # out of file descriptors: pick ports, check them at admission
            self.log.warning(
                "kernel %s: cannot hold its ports while it waits (%s); another process may "
                "take them",
                short_id(spec.kernel_id),
                exc,
            )
            return held_ports.HeldPorts(ip, tuple(launchers.free_ports(ip, 5)))

    # -- scheduling ------------------------------------------------------------------------

    def _schedule(self) -> None:
        """Run the admission engine over every group and carry out its decision."""
        if self._closed:
            return  # closing: nothing new starts while the groups are released
        pending = [g.request for g in self._groups.values() if self._is_waiting(g)]
        admitted = [
            replace(g.admitted, evicting=bool(g.evicting))
            for g in self._groups.values()
            if g.admitted is not None
        ]
        decision = admission.schedule(self._quota().cluster_queue(), pending, admitted)
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

    def _root(self, spec: GroupSpec) -> Path:
        return Path(spec.checkpoint.path or self.checkpoint_root)

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
        feed.publish(group, GroupStatus(GroupPhase.ADMITTED, flavor=quota.FLAVOR, devices=devices))
        self.log.info("kernel %s admitted with GPUs %s", short_id(group.spec.kernel_id), devices)
        group.task = self._tasks.spawn(self._run(group), f"run {group.spec.name}")

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
        if group.stopping is not None or self._groups.get(spec.kernel_id) is not group:
            # Stopped or released between its admission and this task's start.
            if self._groups.get(spec.kernel_id) is group:
                self._finish(group, 0, "stopped before it started")
            return
        # A resumed kernel's ports were free while it was down: it may have lost one.
        taken = group.ports.hold()
        if taken:
            self._finish(group, None, self._taken_at_admission(group, taken), failed=True)
            return
        group.ports.lend()  # from here to the launcher's exit the kernel listens there
        group.launches += 1
        request = launchers.LaunchRequest(
            kernel_id=spec.kernel_id,
            argv=spec.argv,
            env=spec.env,
            cwd=spec.cwd,
            launch=self._launch(spec, group.ref.connection),
            devices=group.status.devices,
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

    def _taken_at_admission(self, group: _Group, taken: list[int]) -> str:
        who, ports = f"kernel {short_id(group.spec.kernel_id)}", group.ports.describe(taken)
        verb = "is" if len(taken) == 1 else "are"
        if group.launches:
            return (
                f"{who} cannot resume: {ports}, where its clients reconnect, {verb} taken by "
                "another process; start the kernel again and it gets new ports"
            )
        return (
            f"{who} cannot start: {ports} {verb} taken by another process; start the kernel "
            "again and it gets new ports"
        )

    async def _check_checkpoint_root(self, who: str) -> None:
        """The server-wide checkpoint directory must be usable before a kernel relies on it
        (the kernelspec's own `checkpoint.path` was checked by `spec.build`)."""
        root = Path(self.checkpoint_root)
        problem = (
            f"{root} is not an absolute path"
            if not root.is_absolute()
            else await asyncio.to_thread(kernelspecs.directory_problem, root)
        )
        if problem is not None:
            raise errors.ConfigError(
                f"{who}: c.LocalBackend.checkpoint_root is '{root}', but {problem}; set it to an "
                "absolute directory this server can write, or give the kernelspec a "
                "`checkpoint.path`."
            )

    def _checkpoint_dir(self, spec: GroupSpec) -> Path | None:
        if not spec.checkpoint.enabled:
            return None
        return Path(spec.checkpoint.path or self.checkpoint_root) / spec.kernel_id

    def _launch(self, spec: GroupSpec, connection: ConnectionInfo) -> contract.Launch:
        """The launcher's inputs: its ports, key and checkpoint store. Its stop timeout is the
        whole grace period (this backend kills the launcher only after it)."""
        directory = self._checkpoint_dir(spec)
        return contract.Launch(
            grace_seconds=spec.grace_seconds,
            pod=False,
            ports=connection.ports,
            ip=connection.ip,
            key=connection.key,
            transport=connection.transport,
            signature_scheme=connection.signature_scheme,
            parent_death=True,
            checkpoint_dir=None if directory is None else str(directory),
            keep_checkpoints=spec.checkpoint.keep,
        )

    def _on_launcher_event(self, group: _Group, event: dict[str, Any]) -> None:
        if event.get("event") == "checkpoint":
            group.saved = str(event.get("summary") or "")
            self.log.info("kernel %s: %s", short_id(group.spec.kernel_id), group.saved)
            return
        status = group.status
        if event.get("event") == "started" and group.process is not None and group.process.pid:
            self._ledger.launcher_started(group.spec.kernel_id, group.process.pid)
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
        who = f"kernel {short_id(group.spec.kernel_id)}"
        if group.evicting and group.stopping is None:
            self.log.info("%s stopped after preemption; requeued", who)
            group.evicting = ""
            group.admitted = None
            group.ports.hold()  # held while it waits; a port lost now is retried at admission
            # Back of the line, as Kueue requeues by eviction time; `_schedule` publishes the place.
            group.request = replace(group.request, created=float(next(self._arrivals)))
            group.status = GroupStatus(GroupPhase.QUEUED, message=group.saved)
            self._schedule()
            return
        if group.stopping is None:  # the kernel ended on its own: did someone take a port?
            taken = group.ports.hold()
            if taken:
                ports, verb = group.ports.describe(taken), "is" if len(taken) == 1 else "are"
                message = (
                    f"the kernel exited with code {code}: {ports} {verb} taken by another "
                    "process, so the kernel could not listen there; start the kernel again and "
                    "it gets new ports"
                )
                self._finish(group, code, message + launchers.log_tail(group.log_path), failed=True)
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
        if self._groups.get(group.spec.kernel_id) is group:
            del self._groups[group.spec.kernel_id]
        group.admitted = None
        group.ports.close()
        feed.publish(group, GroupStatus(phase, message=message, exit_code=code))
        self._schedule()

    def _signal(self, group: _Group, signum: int) -> None:
        if group.process is not None:
            group.process.signal(signum)

    async def _terminate(self, group: _Group, grace: float) -> None:
        """SIGTERM the launcher (it stops the kernel), SIGKILL it if it outlives `grace`."""
        if group.process is None:
            return
        self._signal(group, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        process = group.process
        try:
            kill_after = max(grace, 0) + contract.LOCAL_KILL_MARGIN_SECONDS
            await asyncio.wait_for(process.exited.wait(), timeout=kill_after)
        except TimeoutError:
            process.signal(signal.SIGKILL)
            await process.exited.wait()


async def _kill_after(process: launchers.LauncherProcess, seconds: float) -> None:
    """SIGKILL the launcher if it still runs `seconds` from now."""
    try:
        await asyncio.wait_for(process.exited.wait(), timeout=seconds)
    except TimeoutError:
        process.signal(signal.SIGKILL)
