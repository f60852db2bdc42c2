"""The local backend's settings (`c.LocalBackend.<trait>`), and where its kernels' files go.

`LocalSettings` holds the traits; `LocalBackend` derives from it, so each is configured under the
backend's own name. Its methods find the GPUs kernels may be given, name a kernel's log and
checkpoint directory, and check the server-wide checkpoint directory; `directory_problem` is the
check of any checkpoint directory (`spec` applies it to a kernelspec's own `checkpoint.path`),
`planted_problem` the check of a kernel's own directory before each launch.
Nothing is read or created at import.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir, jupyter_runtime_dir
from traitlets import Bool, Dict, Float, Int, List, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from kernel_queue import admission, errors, ids, quantities
from kernel_queue.backends.local import gpus as gpu_detection
from kernel_queue.backends.local import quota
from kernel_queue.machine import protocol
from kernel_queue.model import GroupSpec


class LocalSettings(LoggingConfigurable):
    """The traits of `LocalBackend`."""

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
    spare_launcher = Bool(
        True,
        config=True,
        help="""Keep one kernel launcher started ahead (an idle Python process of a few MiB,
        ended with the server), so that an admitted kernel does not wait for a launcher's own
        start (about 40 ms). The spare is started a second after each launch; one started with
        other PYTHON*, LD_*, HOME or locale variables than a kernel's is not used for it.""",
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
        self._inventory: tuple[str, ...] | None = None
        self._pretend = False
        self._inventory_lock = asyncio.Lock()

    async def inventory(self) -> tuple[str, ...]:
        """The GPU ids kernels can be given; detected once, off the event loop."""
        async with self._inventory_lock:
            if self._inventory is None:
                self._inventory, self._pretend = await self.find_gpus()
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

    def local_quota(self) -> quota.LocalQuota:
        """The quota these settings and the detected GPUs make (none before `inventory`)."""
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

    def machine_quota(self) -> protocol.Quota:
        """The same quota as the machine's queue service enforces it."""
        return self.local_quota().machine(self._inventory or ())

    async def find_gpus(self) -> tuple[tuple[str, ...], bool]:
        """The GPU ids kernels may be given, and whether they are pretend ones: `gpus`, else
        the server's CUDA_VISIBLE_DEVICES, else what the driver reports (detected in a worker
        thread), else `pretend_gpus` of them."""
        if self.gpus is not None:
            return tuple(self.gpus), False
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return tuple(d.strip() for d in visible.split(",") if d.strip()), False
        found = await asyncio.to_thread(gpu_detection.detect)
        if found:
            return tuple(gpu.index for gpu in found), False
        return tuple(str(i) for i in range(self.pretend_gpus)), self.pretend_gpus > 0

    def log_path(self, name: str) -> Path:
        """The log file of group `name`."""
        return Path(self.log_dir) / f"{name}.log"

    def checkpoint_root_of(self, spec: GroupSpec) -> Path:
        """The directory the kernel's checkpoint directory lies in."""
        return Path(spec.checkpoint.path or self.checkpoint_root)

    def checkpoint_dir(self, spec: GroupSpec) -> Path | None:
        """The kernel's checkpoint directory, None when its checkpoints are off."""
        if not spec.checkpoint.enabled:
            return None
        return self.checkpoint_root_of(spec) / ids.directory(spec.kernel_id)

    async def check_checkpoint_root(self, who: str) -> None:
        """The server-wide checkpoint directory must be usable before a kernel relies on it
        (the kernelspec's own `checkpoint.path` was checked by `spec.build`)."""
        root = Path(self.checkpoint_root)
        problem = (
            f"{root} is not an absolute path"
            if not root.is_absolute()
            else await asyncio.to_thread(directory_problem, root)
        )
        if problem is not None:
            raise errors.ConfigError(
                f"{who}: c.LocalBackend.checkpoint_root is '{root}', but {problem}; set it to an "
                "absolute directory this server can write, or give the kernelspec a "
                "`checkpoint.path`."
            )


def directory_problem(directory: Path) -> str | None:
    """Why this process could not create and write in `directory`; None when it can.

    Looks at the nearest existing ancestor and creates nothing. The local backend calls it at
    launch for the checkpoint directory it will use."""
    probe = directory
    while not probe.exists() and not probe.is_symlink() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    kind = _pseudo_filesystem(probe)
    if kind:  # root passes os.access there, yet nothing can be made in it
        return f"{probe} lies in {kind}, which the operating system makes up: no files go there"
    if not os.access(probe, os.W_OK | os.X_OK) or _read_only(probe):
        return f"this server cannot write in {probe}"
    return None


_PSEUDO = {
    "proc": "/proc",
    "sysfs": "/sys",
    "devtmpfs": "/dev",
    "cgroup": "a cgroup file system",
    "cgroup2": "a cgroup file system",
    "debugfs": "debugfs",
    "tracefs": "tracefs",
    "securityfs": "securityfs",
    "configfs": "configfs",
    "bpf": "bpffs",
}
"""Pseudo file systems, by type, and how a sentence names them."""


def _pseudo_filesystem(directory: Path) -> str:
    """How a sentence names the pseudo file system `directory` lies on; '' for a real one."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        where = os.path.realpath(directory)
    except OSError:
        return ""
    best, kind = "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return _PSEUDO.get(kind, "")


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def planted_problem(directory: Path | None) -> str | None:
    """Why the kernel's own checkpoint directory is not its own (None when it is, or is not
    there yet): a symlink, a file, or another user's directory put in its place, say while the
    kernel was parked. Followed, a restore would rename another kernel's checkpoints aside as
    foreign and write its own among them; so the launch is refused and the thing left as found.
    """
    if directory is None:
        return None
    fix = "remove it and start the kernel again"
    if directory.is_symlink():
        try:
            target = os.readlink(directory)
        except OSError:  # removed or replaced again since
            target = "another place"
        return (
            f"its checkpoint directory {directory} is a symlink to {target}, which someone put "
            f"in its place; this server never reads or writes checkpoints through a link: {fix}"
        )
    try:
        owner = directory.stat().st_uid
    except OSError:  # not there yet (the launcher makes it), or unreadable: the launcher says
        return None
    if not directory.is_dir():
        return f"its checkpoint directory {directory} is not a directory: {fix}"
    if owner != os.geteuid():
        return (
            f"its checkpoint directory {directory} belongs to another user (uid {owner}), who "
            f"could change what it restores: {fix}"
        )
    return None
