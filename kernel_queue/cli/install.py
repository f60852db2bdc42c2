"""`jupyter kernel-queue install`: write a queued kernelspec from command-line options.

Every option is checked before anything is written: an unknown option (`arguments`), a bad
value, and the queue and priority class against what the backend has (`install_checks`). The
kernelspec is built in a temporary directory and installed with jupyter_client's
KernelSpecManager (`--user`, `--sys-prefix`, `--prefix`), refusing to overwrite an existing one
unless `--replace` is given. A local kernelspec runs the kernel with this interpreter
(`sys.executable`), whatever the server's PATH finds. It prints one line.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_core.application import JupyterApp
from jupyter_core.paths import SYSTEM_JUPYTER_PATH, jupyter_data_dir
from traitlets import Bool, Float, Int, Unicode

from kernel_queue import backends, quantities, spec
from kernel_queue import gateway as eg
from kernel_queue.cli import arguments, install_checks
from kernel_queue.cli.install_checks import InstallError

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
KERNEL_ARGV = ["python", "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"]
"""The kernel's command; `python` is the interpreter of wherever the kernel runs (a pod's)."""
DEFAULT_QUEUES = {True: "gpu", False: "cpu"}
"""The local queue of a kernel with GPUs and of one without: the shipped kernelspecs' queues."""
GATEWAYS = ("enterprise-gateway",)
CHECKPOINT_OPTIONS = {
    "checkpoint": "--checkpoint",
    "checkpoint.enabled": "--checkpoint",
    "checkpoint.path": "--checkpoint-path",
    "checkpoint.claim": "--checkpoint-claim",
    "checkpoint.grace_seconds": "--grace-seconds",
    "checkpoint.keep": "--keep-checkpoints",
}
"""The option that sets each kernelspec `checkpoint` key (for `spec.checkpoint_settings`)."""


def kernel_json(
    *,
    display_name: str,
    backend: str,
    queue: str,
    gpus: int,
    pod_group_size: int = 1,
    worker_command: str = "",
    cpu: str = "",
    memory: str = "",
    image: str = "",
    namespace: str = "",
    priority_class: str = "",
    admission_timeout: float = 0.0,
    gateway: str = "",
    checkpoint: bool = False,
    checkpoint_path: str = "",
    checkpoint_claim: str = "",
    grace_seconds: float | None = None,
    keep_checkpoints: bool = False,
    interpreter: str = "python",
) -> dict[str, Any]:
    """The kernel.json of a queued Python kernel; raises InstallError naming a bad option.
    `interpreter` is argv[0]. `worker_command` is one line, split as a POSIX shell splits
    words (``shlex``) into the kernelspec's `worker_command` list.

    The checkpoint options follow the kernelspec's rules (`spec.checkpoint_settings`, the same
    code that checks a hand-written kernelspec), worded as options.

    `gateway="enterprise-gateway"` adds `metadata.process_proxy` for Enterprise Gateway 3.x
    beside `metadata.kernel_provisioner`: each reads its own stanza, both read the same config.
    """
    if gateway and gateway not in GATEWAYS:
        raise InstallError(
            f"--gateway must be one of {', '.join(GATEWAYS)} (or left out), not {gateway!r}"
        )
    if backend not in backends.NAMES:
        raise InstallError(f"--backend must be one of {', '.join(backends.NAMES)}, not {backend!r}")
    if gpus < 0:
        raise InstallError(f"--gpus must be 0 or more, not {gpus}")
    if not math.isfinite(admission_timeout) or admission_timeout < 0:
        raise InstallError(
            f"--admission-timeout must be 0 (wait forever) or a finite number of seconds, not "
            f"{admission_timeout}"
        )
    if not queue:
        raise InstallError("--queue must name a queue, such as 'default'")
    for option, value in (("--display-name", display_name), ("--queue", queue)):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InstallError(
                f"{option} {value!r} is not valid UTF-8 text; write it in UTF-8"
            ) from None
    if backend == "kubernetes":
        for option, value, key in (
            ("--queue", queue, "queue"),
            ("--namespace", namespace, "namespace"),
            ("--priority-class", priority_class, "priority_class"),
        ):
            rule = spec.kube_name_problem(key, value)
            if value and rule:
                raise InstallError(f"{option} {value!r} is not {rule}")
    for option, value, parse in (
        ("--cpu", cpu, quantities.millicores),
        ("--memory", memory, quantities.bytes_),
    ):
        if value:
            try:
                parse(value)
            except ValueError as exc:
                raise InstallError(f"{option}: {exc}") from None
    if backend == "kubernetes" and not image:
        raise InstallError(
            "--image is required for the kubernetes backend: pass the image the kernel runs in, "
            "one with Python and ipykernel (such as quay.io/jupyter/minimal-notebook)"
        )
    if pod_group_size < 1:
        raise InstallError(f"--pod-group-size must be 1 or more pods, not {pod_group_size}")
    if pod_group_size > 1 and backend != "kubernetes":
        raise InstallError(
            "--pod-group-size is for the kubernetes backend (a kernel of several pods); "
            "leave it out, or pass --backend kubernetes"
        )
    argv = _worker_argv(worker_command, pod_group_size)
    config: dict[str, Any] = {"backend": backend, "queue": queue, "gpus": gpus}
    if pod_group_size > 1:
        config["pod_group_size"] = pod_group_size
    if argv:
        config["worker_command"] = argv
    optional = {
        "cpu": cpu,
        "memory": memory,
        "image": image,
        "namespace": namespace,
        "priority_class": priority_class,
    }
    config.update({key: value for key, value in optional.items() if value})
    if admission_timeout:
        config["admission_timeout"] = admission_timeout
    stanza = _checkpoint(
        backend, checkpoint, checkpoint_path, checkpoint_claim, grace_seconds, keep_checkpoints
    )
    if stanza:
        config["checkpoint"] = stanza
    metadata: dict[str, Any] = {
        "debugger": True,
        "kernel_provisioner": {"provisioner_name": "kernel-queue", "config": config},
    }
    if gateway == "enterprise-gateway":
        metadata["process_proxy"] = {"class_name": eg.CLASS_NAME}
    return {
        "argv": [interpreter, *KERNEL_ARGV[1:]],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "message",
        "metadata": metadata,
    }


def _worker_argv(line: str, pod_group_size: int) -> list[str]:
    """`--worker-command`'s words (``shlex.split``); InstallError where it cannot be split, or
    where the kernel has no worker to run it."""
    if not line.strip():
        return []
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise InstallError(
            f"--worker-command {line!r} cannot be split into words ({exc}); quote it as a shell "
            "would, such as --worker-command='dask worker tcp://$(MASTER_ADDR):8786'"
        ) from None
    if pod_group_size < 2:
        raise InstallError(
            "--worker-command is what each worker pod of a group runs, and this kernel has one "
            "pod: pass --pod-group-size 2 or more, or leave --worker-command out"
        )
    return argv


def _checkpoint(
    backend: str, enabled: bool, path: str, claim: str, grace: float | None, keep: bool
) -> dict[str, Any]:
    """The `checkpoint` stanza of these options ({} when none is given), checked."""
    stanza: dict[str, Any] = {}
    if enabled or path or claim:
        stanza["enabled"] = True
    if path:
        stanza["path"] = path
    if claim:
        stanza["claim"] = claim
    if grace is not None:
        stanza["grace_seconds"] = int(grace) if float(grace).is_integer() else grace
    if keep:
        stanza["keep"] = True
    try:
        spec.checkpoint_settings(stanza, backend, name=CHECKPOINT_OPTIONS.__getitem__)
    except spec.Problem as problem:
        raise InstallError(
            f"{CHECKPOINT_OPTIONS[problem.key]} {problem.problem}; {problem.fix}"
        ) from None
    return stanza


class InstallApp(arguments.StrictOptions):
    """Write a queued kernelspec.

    Example: jupyter kernel-queue install --name gpu2 --gpus 2 --queue gpu --user
    """

    name = "jupyter-kernel-queue-install"
    description = __doc__
    command = "jupyter kernel-queue install"

    kernel_name = Unicode("python3-queued", config=True, help="Kernelspec name (directory).")
    display_name = Unicode("", config=True, help="Name shown in JupyterLab's launcher.")
    backend = Unicode("local", config=True, help="'local' or 'kubernetes'.")
    queue = Unicode(
        None,
        allow_none=True,
        config=True,
        help="""Queue to wait in: one of the local backend's queues (default 'gpu' with GPUs,
        'cpu' without, as the shipped kernelspecs), or a Kueue LocalQueue (kubernetes: required).
        Checked against the server's config, or the cluster.""",
    )
    gpus = Int(1, config=True, help="GPUs each kernel asks for (each pod, in a group of pods).")
    pod_group_size = Int(
        1, config=True, help="Kubernetes backend: the kernel's pods (the head and its workers)."
    )
    worker_command = Unicode(
        "",
        config=True,
        help="""Kubernetes backend, with --pod-group-size 2 or more: the command each worker pod
        runs, one line split into words as a shell would ('dask worker tcp://$(MASTER_ADDR):8786';
        Kubernetes expands $(VAR)).""",
    )
    cpu = Unicode("", config=True, help="CPU each kernel asks for ('2', '500m').")
    memory = Unicode("", config=True, help="Memory each kernel asks for ('8Gi').")
    image = Unicode("", config=True, help="Kernel image (kubernetes backend).")
    namespace = Unicode("", config=True, help="Namespace (kubernetes backend).")
    priority_class = Unicode(
        "",
        config=True,
        help="Priority class: the local backend's, or a Kueue WorkloadPriorityClass (checked).",
    )
    admission_timeout = Float(0.0, config=True, help="Seconds to wait in the queue; 0 = forever.")
    gateway = Unicode(
        "", config=True, help="'enterprise-gateway': add Enterprise Gateway 3.x's process proxy."
    )
    checkpoint = Bool(False, config=True, help="Save on preemption, restore on re-admission.")
    checkpoint_path = Unicode(
        "", config=True, help="Local backend: the checkpoint directory (absolute; turns them on)."
    )
    checkpoint_claim = Unicode(
        "",
        config=True,
        help="Kubernetes backend: the PersistentVolumeClaim holding checkpoints (turns them on).",
    )
    grace_seconds = Float(
        None,
        allow_none=True,
        config=True,
        help="Seconds a preempted kernel gets to save and stop (default 30).",
    )
    keep_checkpoints = Bool(False, config=True, help="Keep checkpoints after shutdown.")
    user = Bool(False, config=True, help="Install for the current user.")
    sys_prefix = Bool(False, config=True, help="Install into sys.prefix (this environment).")
    prefix = Unicode("", config=True, help="Install under this prefix.")
    replace = Bool(False, config=True, help="Overwrite an existing kernelspec of that name.")

    aliases = {
        **JupyterApp.aliases,
        "name": "InstallApp.kernel_name",
        "display-name": "InstallApp.display_name",
        "backend": "InstallApp.backend",
        "queue": "InstallApp.queue",
        "gpus": "InstallApp.gpus",
        "pod-group-size": "InstallApp.pod_group_size",
        "worker-command": "InstallApp.worker_command",
        "cpu": "InstallApp.cpu",
        "memory": "InstallApp.memory",
        "image": "InstallApp.image",
        "namespace": "InstallApp.namespace",
        "priority-class": "InstallApp.priority_class",
        "admission-timeout": "InstallApp.admission_timeout",
        "gateway": "InstallApp.gateway",
        "checkpoint-path": "InstallApp.checkpoint_path",
        "checkpoint-claim": "InstallApp.checkpoint_claim",
        "grace-seconds": "InstallApp.grace_seconds",
        "prefix": "InstallApp.prefix",
    }
    flags = {
        **JupyterApp.flags,
        "user": ({"InstallApp": {"user": True}}, "Install for the current user."),
        "sys-prefix": ({"InstallApp": {"sys_prefix": True}}, "Install into sys.prefix."),
        "replace": ({"InstallApp": {"replace": True}}, "Overwrite an existing kernelspec."),
        "checkpoint": ({"InstallApp": {"checkpoint": True}}, "Turn checkpoints on."),
        "keep-checkpoints": (
            {"InstallApp": {"keep_checkpoints": True}},
            "Keep checkpoints after shutdown.",
        ),
    }

    def start(self) -> None:
        try:
            path, note = self.install()
        except InstallError as exc:
            print(f"{self.command}: {exc}", file=sys.stderr)
            self.exit(2)
        checked = ""
        if note.startswith(install_checks.NOT_CHECKED):
            print(f"{self.command}: {note}", file=sys.stderr)
        elif note:
            checked = f" ({note})"
        print(f"Installed kernelspec {self.kernel_name} in {path}{checked}")

    def install(self) -> tuple[str, str]:
        """Validate, then write the kernelspec; return where it went and, for the kubernetes
        backend, what was found on the cluster (or `NOT_CHECKED` and why)."""
        if not _NAME.match(self.kernel_name):
            raise InstallError(
                f"--name {self.kernel_name!r} is not a kernelspec name: use lower-case letters, "
                "digits, '.', '_' and '-'"
            )
        if sum(bool(x) for x in (self.user, self.sys_prefix, self.prefix)) > 1:
            raise InstallError("choose at most one of --user, --sys-prefix and --prefix")
        local = self.backend == "local"
        if self.queue is not None and not self.queue.strip():
            fix = (
                "name the queue the kernel waits in, or leave --queue out for the default "
                "('gpu' with GPUs, 'cpu' without)"
                if local
                else "name the LocalQueue the kernel waits in"
            )
            raise InstallError(f"--queue is empty: {fix}")
        queue = self.queue or (DEFAULT_QUEUES[self.gpus > 0] if local else "")
        plural = "GPU" if self.gpus == 1 else "GPUs"
        asks = f"{self.gpus} {plural}"
        if self.pod_group_size > 1:
            asks = f"{self.pod_group_size} pods of {asks}"
        display = self.display_name or f"Python 3 ({asks}, queued in {queue})"
        if self.backend == "kubernetes" and not queue:
            raise InstallError(
                "--queue is required for the kubernetes backend: name the LocalQueue the "
                "kernel waits in (`kubectl get localqueues -n <namespace>` lists them)"
            )
        spec = kernel_json(
            display_name=display,
            backend=self.backend,
            queue=queue,
            gpus=self.gpus,
            pod_group_size=self.pod_group_size,
            worker_command=self.worker_command,
            cpu=self.cpu,
            memory=self.memory,
            image=self.image,
            namespace=self.namespace,
            priority_class=self.priority_class,
            admission_timeout=self.admission_timeout,
            gateway=self.gateway,
            checkpoint=self.checkpoint,
            checkpoint_path=self.checkpoint_path,
            checkpoint_claim=self.checkpoint_claim,
            grace_seconds=self.grace_seconds,
            keep_checkpoints=self.keep_checkpoints,
            interpreter=sys.executable if local else "python",
        )
        if local:
            install_checks.check_local(queue, self.priority_class)
            note = ""
        else:
            note = install_checks.cluster_check(queue, self.priority_class, self.namespace)
        prefix = sys.prefix if self.sys_prefix else (self.prefix or None)
        destination = _destination(self.kernel_name, user=self.user, prefix=prefix)
        if destination.exists() and not self.replace:
            raise InstallError(
                f"a kernelspec named {self.kernel_name!r} already exists in {destination}; "
                "pass --replace to overwrite it"
            )
        try:
            return self._write(spec, destination, prefix), note
        except OSError as exc:
            raise InstallError(
                f"could not write the kernelspec in {destination}: "
                f"{exc.strerror or exc}; pick a place you can write (--user, or a --prefix of "
                "yours), or run as its owner"
            ) from None

    def _write(self, spec: dict[str, Any], destination: Path, prefix: str | None) -> str:
        # Its own logger, quiet: the one line printed says what was installed where.
        quiet = logging.getLogger("kernel_queue.cli.install.kernelspecs")
        quiet.setLevel(logging.WARNING)
        manager = KernelSpecManager(parent=self, log=quiet)
        with tempfile.TemporaryDirectory() as folder:
            # Readable by every user's server (the copy keeps these modes, whatever the umask):
            # a temporary folder is 0700, and a kernelspec root installs was no one else's.
            os.chmod(folder, 0o755)
            (Path(folder) / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
            os.chmod(Path(folder) / "kernel.json", 0o644)
            path = manager.install_kernel_spec(
                folder, kernel_name=self.kernel_name, user=self.user, prefix=prefix
            )
        return str(path)


def _destination(name: str, *, user: bool, prefix: str | None) -> Path:
    """Where KernelSpecManager.install_kernel_spec puts a kernelspec with these options."""
    if user:
        return Path(jupyter_data_dir()) / "kernels" / name
    if prefix:
        return Path(prefix) / "share" / "jupyter" / "kernels" / name
    return Path(SYSTEM_JUPYTER_PATH[0]) / "kernels" / name
