"""Turn a provisioner's traits and kernelspec into a validated `GroupSpec`.

Called from `pre_launch` (and by Enterprise Gateway's proxy), so every bad value becomes a
`ConfigError` that names the kernelspec, the key and the fix before anything is created. The
checkpoint rules are shared with `jupyter kernel-queue install` (`checkpoint_settings`). Pure
apart from reading the kernelspec object and, for a local checkpoint `path`, the filesystem.
"""

from __future__ import annotations

import getpass
import math
import os
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kernel_queue import backends, errors, ids, options, quantities
from kernel_queue.backends.local import settings as local_settings
from kernel_queue.kube import names
from kernel_queue.kube.objects import pod_policy
from kernel_queue.launcher import contract
from kernel_queue.model import CheckpointSettings, ConnectionInfo, GroupSpec

CONNECT_MODES = ("service", "pod-ip")
CHECKPOINT_KEYS = ("enabled", "path", "claim", "grace_seconds", "keep", "continuous")
DEFAULT_GRACE_SECONDS = contract.DEFAULT_GRACE_SECONDS
_PYTHONS = {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}
_LABEL_RULE = (
    "lower-case letters, digits, '-' and '.', at most 63 characters, starting and ending with "
    "a letter or digit"
)
_SUBDOMAIN_RULE = (
    "lower-case letters, digits, '-' and '.', at most 253 characters, each dot-separated part "
    "starting and ending with a letter or digit"
)
_DNS_LABEL_RULE = (
    "lower-case letters, digits and '-', at most 63 characters, starting and ending with a "
    "letter or digit"
)
# Kubernetes names the kubernetes backend sends: (key, what it is, check, rule).
_KUBE_NAMES: tuple[tuple[str, str, Callable[[str], bool], str], ...] = (
    ("queue", "a LocalQueue name", names.is_queue_name, _LABEL_RULE),
    ("namespace", "a namespace name", names.is_dns_label, _DNS_LABEL_RULE),
    ("priority_class", "a WorkloadPriorityClass name", names.is_queue_name, _LABEL_RULE),
    ("service_account", "a ServiceAccount name", names.is_dns_subdomain, _SUBDOMAIN_RULE),
    (
        "gpu_resource",
        "an extended resource name",
        names.is_extended_resource,
        "a domain, '/' and a name, such as 'nvidia.com/gpu'",
    ),
)
_TEXT_KEYS = (
    "backend",
    "queue",
    "namespace",
    "image",
    "gpu_resource",
    "priority_class",
    "service_account",
    "connect",
)


@dataclass(frozen=True)
class Problem(Exception):
    """One bad value: `name(key)` `problem`; `fix`. Each caller words the key its own way
    (`checkpoint.path` in a kernelspec, `--checkpoint-path` on the command line)."""

    key: str
    problem: str
    fix: str


Namer = Callable[[str], str]


def kernelspec_key(key: str) -> str:
    """How a kernelspec error names a key: `` `checkpoint.path` ``."""
    return f"`{key}`"


def build(provisioner: Any, *, argv_extra: list[str], cwd: str | None) -> GroupSpec:
    """Validate `provisioner`'s traits and build the spec of its kernel's group."""
    ids.check(provisioner.kernel_id)  # names and paths come from the id: refuse a bad one first
    kernelspec = provisioner.kernel_spec
    name = getattr(provisioner.parent, "kernel_name", "") or kernelspec.display_name or "?"
    where = f"kernelspec {name!r}"
    metadata = getattr(kernelspec, "metadata", None) or {}
    given = (metadata.get("kernel_provisioner") or {}).get("config") or {}
    options.check_keys(given, where=where, stanza="metadata.kernel_provisioner.config")
    try:
        _local_has_no_kube_keys(given, provisioner.backend)
        return _build(provisioner, kernelspec, name, argv_extra, cwd)
    except Problem as problem:
        raise errors.ConfigError(
            f"{where}: {kernelspec_key(problem.key)} {problem.problem}; {problem.fix}"
        ) from None


KUBE_ONLY_KEYS = (
    "image",
    "namespace",
    "service_account",
    "pod_template",
    "gpu_resource",
    "worker_command",
)
"""Kernelspec keys only the kubernetes backend reads."""


def _local_has_no_kube_keys(given: Any, backend: str) -> None:
    """A kernelspec of the local backend that sets a kubernetes-only key was written for a
    cluster (or the key is a mistake): say so rather than ignore it."""
    if backend != "local" or not isinstance(given, dict):
        return
    for key in KUBE_ONLY_KEYS:
        if key in given:
            raise Problem(
                key,
                "is read by the kubernetes backend only, and this kernelspec runs on the local "
                "backend",
                "remove it, or set `backend` to 'kubernetes'",
            )


def _build(
    provisioner: Any, kernelspec: Any, name: str, argv_extra: list[str], cwd: str | None
) -> GroupSpec:
    backend = provisioner.backend
    for key in _TEXT_KEYS:
        _text(key, getattr(provisioner, key))
    if backend not in backends.NAMES:
        raise Problem(
            "backend",
            f"is {backend!r}, which is not a backend",
            f"set it to one of {', '.join(repr(n) for n in backends.NAMES)}",
        )
    if not provisioner.queue:
        raise Problem("queue", "is empty", "name the queue to wait in, such as 'default'")
    if provisioner.gpus < 0:
        raise Problem("gpus", f"is {provisioner.gpus}", "ask for 0 or more GPUs")
    if provisioner.pod_group_size < 1:
        raise Problem("pod_group_size", f"is {provisioner.pod_group_size}", "use 1 or more pods")
    worker_command = _worker_command(provisioner.worker_command, provisioner.pod_group_size)
    admission_timeout = provisioner.admission_timeout
    if not math.isfinite(admission_timeout) or admission_timeout < 0:
        raise Problem(
            "admission_timeout",
            f"is {options.shown(admission_timeout)}",
            "give a finite number of seconds, or 0 to wait forever",
        )
    if provisioner.connect not in CONNECT_MODES:
        raise Problem(
            "connect",
            f"is {provisioner.connect!r}",
            f"use one of {', '.join(repr(m) for m in CONNECT_MODES)}",
        )
    startup_timeout = provisioner.startup_timeout
    if not math.isfinite(startup_timeout) or startup_timeout <= 0:
        raise Problem(
            "startup_timeout",
            f"is {options.shown(startup_timeout)}",
            "give the finite, positive number of seconds a kernel may take to start",
        )
    allowed: tuple[str, ...] = ()
    if backend == "kubernetes":
        _kube_names(provisioner)
        allowed = _pod_template(provisioner, f"kernelspec {name!r}")
    cpu = _quantity(provisioner.cpu, "cpu", quantities.millicores)
    memory = _quantity(provisioner.memory, "memory", quantities.bytes_)
    checkpoint, grace = checkpoint_settings(provisioner.checkpoint, backend)
    park_after = _park_after(provisioner.park_after, checkpoint, backend, provisioner.connect)
    if backend == "local" and checkpoint.enabled and checkpoint.path:
        problem = local_settings.directory_problem(Path(checkpoint.path))
        if problem is not None:
            raise Problem(
                "checkpoint.path",
                f"is {checkpoint.path!r}, but {problem}",
                "give a directory this server can create and write in",
            )
    argv = _argv(list(kernelspec.argv) + list(argv_extra), kernelspec, backend)
    if not argv:
        raise Problem("argv", "is empty", "give the kernel command in kernel.json's argv")
    return GroupSpec(
        kernel_id=provisioner.kernel_id,
        kernelspec=name,
        queue=provisioner.queue,
        argv=tuple(argv),
        connection=ConnectionInfo("127.0.0.1", 0, 0, 0, 0, 0, key=secrets.token_hex(32)),
        gpus=provisioner.gpus,
        cpu=cpu,
        memory=memory,
        priority_class=provisioner.priority_class or None,
        cwd=cwd,
        user=os.environ.get("KERNEL_USERNAME") or getpass.getuser(),
        grace_seconds=grace,
        checkpoint=checkpoint,
        namespace=provisioner.namespace,
        image=provisioner.image,
        gpu_resource=provisioner.gpu_resource,
        pod_group_size=provisioner.pod_group_size,
        worker_command=worker_command,
        pod_template=dict(provisioner.pod_template),
        service_account=provisioner.service_account,
        connect=provisioner.connect,
        backend=backend,
        park_after=park_after,
        allowed_exceptions=allowed,
    )


def _worker_command(argv: list[str], size: int) -> tuple[str, ...]:
    """`worker_command`: only for a group of several pods (a kernel of one has no worker), and
    a command to run: a first word that is not empty."""
    if not argv:
        return ()
    for index, word in enumerate(argv):
        _text(f"worker_command[{index}]", word)
    if size < 2:
        raise Problem(
            "worker_command",
            f"is {options.shown(argv)}, but `pod_group_size` is {size}: a kernel of one pod has "
            "no worker to run it",
            "set `pod_group_size` to 2 or more, or leave `worker_command` out",
        )
    if not argv[0].strip():
        raise Problem(
            "worker_command",
            f"is {options.shown(argv)}, whose first word (the program) is empty",
            'name the program first, such as ["dask", "worker", "tcp://$(MASTER_ADDR):8786"]',
        )
    return tuple(argv)


def with_env(spec: GroupSpec, env: dict[str, str], kernelspec_keys: Iterable[str]) -> GroupSpec:
    """The spec with the kernel's environment.

    `env` is what `pre_launch` prepared: the server's environment plus the kernelspec's `env`
    stanza (substituted). A local kernel gets it all, as jupyter_client's local kernels do; a
    kernel in a pod gets only the kernelspec's keys (never the server's environment).
    """
    if spec.backend == "local":
        return replace(spec, env=dict(env))
    keys = set(kernelspec_keys)
    return replace(spec, env={k: v for k, v in env.items() if k in keys})


def checkpoint_settings(
    config: Mapping[str, Any], backend: str, name: Namer = kernelspec_key
) -> tuple[CheckpointSettings, float]:
    """The `checkpoint` dict's settings and grace seconds; raise `Problem` for a bad one.

    The one set of checkpoint rules, for hand-written kernelspecs and for `install`: known
    keys, types, `path` absolute and only on the local backend, `claim` only (and required) on
    kubernetes, `keep` only with checkpoints on, and a grace period that leaves time to save.
    `name(key)` words the keys of fixes as the caller's user writes them."""
    unknown = options.unknown_keys(config, CHECKPOINT_KEYS)
    if unknown is not None:
        article = "an " if unknown.startswith("unknown key ") else ""
        raise Problem(
            "checkpoint", f"has {article}{unknown}", f"its keys are {', '.join(CHECKPOINT_KEYS)}"
        )
    grace = config.get("grace_seconds", DEFAULT_GRACE_SECONDS)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace <= 0:
        shown = options.shown(grace)
        raise Problem(
            "checkpoint.grace_seconds", f"is {shown}", "give a positive number of seconds"
        )
    if not math.isfinite(grace):
        shown = options.shown(grace)
        raise Problem("checkpoint.grace_seconds", f"is {shown}", "give a finite number of seconds")
    for key in ("enabled", "keep", "continuous"):
        if not isinstance(config.get(key, False), bool):
            raise Problem(
                f"checkpoint.{key}", f"is {options.shown(config[key])}", "write true or false"
            )
    for key in ("path", "claim"):
        if config.get(key) is not None:
            if not isinstance(config[key], str):
                shown = options.shown(config[key])
                raise Problem(f"checkpoint.{key}", f"is {shown}", "write a string")
            _text(f"checkpoint.{key}", config[key])
    path, claim = config.get("path") or None, config.get("claim") or None
    enabled = config.get("enabled", bool(path or claim))
    _checkpoint_place(path, claim, enabled, backend, name)
    if config.get("keep") and not enabled:
        raise Problem(
            "checkpoint.keep",
            "is true but checkpoints are off",
            f"turn them on with {name('checkpoint.enabled')}, or leave {name('checkpoint.keep')} "
            "out",
        )
    if enabled:
        _check_grace(float(grace), backend)
    settings = CheckpointSettings(
        enabled=bool(enabled),
        path=path,
        claim=claim,
        keep=bool(config.get("keep", False)),
        continuous=bool(config.get("continuous", True)),
    )
    return settings, float(grace)


def _park_after(seconds: float, saves: CheckpointSettings, backend: str, connect: str) -> float:
    """`park_after`: finite, 0 or more, and only where a parked kernel keeps its variables and
    its notebook's connection (a pod IP changes when a woken kernel comes back)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise Problem(
            "park_after",
            f"is {options.shown(seconds)}",
            "give the seconds a kernel may sit idle before it is parked, or 0 never to park",
        )
    if seconds and not saves.enabled:
        raise Problem(
            "park_after",
            f"is {seconds:g} but checkpoints are off, so a parked kernel would lose its variables",
            f"turn them on with {kernelspec_key('checkpoint.enabled')}, or set park_after to 0",
        )
    if seconds and backend == "kubernetes" and connect == "pod-ip":
        problem = f"is {seconds:g} with `connect` 'pod-ip', but a woken kernel comes back on "
        problem += "another pod's IP, where the notebook's open connection does not follow"
        fix = "use `connect` 'service' (the default) to park kernels, or set park_after to 0"
        raise Problem("park_after", problem, fix)
    return float(seconds)


def _checkpoint_place(
    path: str | None, claim: str | None, enabled: bool, backend: str, name: Namer
) -> None:
    if backend == "kubernetes":
        if path:
            raise Problem(
                "checkpoint.path",
                "is a directory of this machine, which a pod cannot reach",
                f"on the kubernetes backend name a PersistentVolumeClaim with "
                f"{name('checkpoint.claim')}",
            )
        if enabled and not claim:
            raise Problem(
                "checkpoint.claim",
                "is missing",
                "name the PersistentVolumeClaim that holds checkpoints (ReadWriteMany is best: a "
                "requeued kernel may land on another node)",
            )
        if claim and not names.is_dns_subdomain(claim):
            raise Problem(
                "checkpoint.claim",
                f"is {claim!r}, which Kubernetes does not accept as a PersistentVolumeClaim name",
                f"use {_SUBDOMAIN_RULE}",
            )
        return
    if claim:
        raise Problem(
            "checkpoint.claim",
            "names a PersistentVolumeClaim, which only the kubernetes backend mounts",
            f"on the {backend} backend use {name('checkpoint.path')} (a directory), or leave it "
            "out for the server's default",
        )
    if path and not os.path.isabs(path):
        raise Problem(
            "checkpoint.path",
            f"is {path!r}, a relative path",
            "give an absolute directory, such as '/var/lib/kernel-queue/checkpoints'",
        )


def min_grace_seconds(backend: str) -> int:
    """The least `grace_seconds` whose budget leaves `contract.MIN_SAVE_SECONDS` for a save."""
    return contract.min_grace_seconds(pod=backend == "kubernetes")


def _check_grace(grace: float, backend: str) -> None:
    """The budget of `grace` (`contract.budget`) must leave time to save."""
    if grace >= min_grace_seconds(backend):
        return
    commit = contract.COMMIT_MARGIN_SECONDS
    if backend == "kubernetes":
        how = (
            f"the launcher stops the kernel {contract.KUBELET_MARGIN_SECONDS} s before the pod's "
            f"grace period ends, and the save must end {commit:g} s before that"
        )
    else:
        how = f"the save must end {commit:g} s before the kernel is stopped"
    raise Problem(
        "checkpoint.grace_seconds",
        f"is {grace:g}, which leaves no time to save: {how}",
        f"use {min_grace_seconds(backend)} or more seconds",
    )


def _text(key: str, value: Any) -> None:
    """Refuse text that cannot be written out (a lone surrogate from a JSON escape)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Problem(
                key,
                f"is {value!r}, which is not valid text (a lone surrogate)",
                "write it in plain UTF-8",
            ) from None


def kube_name_problem(key: str, value: str) -> str:
    """'' when `value` is a name Kubernetes accepts for `key` (queue, namespace,
    priority_class, service_account, gpu_resource); else what it must be, in words."""
    for known, what, valid, rule in _KUBE_NAMES:
        if known == key and not valid(value):
            return f"{what} Kubernetes accepts: use {rule}"
    return ""


def _kube_names(provisioner: Any) -> None:
    for key, what, valid, rule in _KUBE_NAMES:
        value = getattr(provisioner, key)
        if value and not valid(value):
            raise Problem(
                key, f"is {value!r}, which Kubernetes does not accept as {what}", f"use {rule}"
            )


def _pod_template(provisioner: Any, where: str) -> tuple[str, ...]:
    """`kube.objects.pod_policy` on the template, less the exceptions the server's admin allows;
    those exceptions."""
    allowed = options.PodTemplatePolicy(config=provisioner.config).allowed_exceptions
    for entry in pod_policy.unknown_exceptions(allowed):
        guess = options.nearest(entry, sorted(pod_policy.RULES))
        maybe = f" (did you mean {guess!r}?)" if guess else ""
        raise errors.ConfigError(
            f"{where}: {pod_policy.SETTING} lists {entry!r}, which is neither a rule{maybe} nor a "
            "field path such as 'spec.volumes[*].hostPath'; fix the server's config"
        )
    found = pod_policy.refused(provisioner.pod_template, allowed)
    if found:
        raise errors.ConfigError(f"{where}: {pod_policy.message(found)}")
    return tuple(allowed)


def _quantity(value: Any, key: str, parse: Any) -> str | None:
    if value is None or value == "":
        return None
    try:
        parse(value)
    except quantities.QuantityError as exc:
        raise Problem(
            key,
            f"is {options.shown(value)}, which {exc.reason}",
            "write a quantity such as 2, '500m' or '8Gi'",
        ) from None
    return str(value)


def _argv(argv: list[str], kernelspec: Any, backend: str) -> list[str]:
    """The kernel command with `{connection_file}` kept for the launcher to fill in."""
    resource_dir = getattr(kernelspec, "resource_dir", "") or ""
    argv = [arg.replace("{resource_dir}", resource_dir) for arg in argv]
    if backend == "local" and argv and argv[0] in _PYTHONS:
        argv[0] = sys.executable
    return argv
