"""Turn a provisioner's traits and kernelspec into a validated `GroupSpec`.

Called from `pre_launch`, so every bad value becomes a `ConfigError` that names the kernelspec,
the key and the fix before anything is created. Pure apart from reading the kernelspec object.
"""

from __future__ import annotations

import getpass
import os
import secrets
import sys
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from kernel_queue import backends, errors, quantities
from kernel_queue.model import CheckpointSettings, ConnectionInfo, GroupSpec, group_name

CONNECT_MODES = ("service", "pod-ip")
CHECKPOINT_KEYS = frozenset({"enabled", "path", "claim", "grace_seconds", "keep"})
DEFAULT_GRACE_SECONDS = 30.0
_PYTHONS = {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}


def build(provisioner: Any, *, argv_extra: list[str], cwd: str | None) -> GroupSpec:
    """Validate `provisioner`'s traits and build the spec of its kernel's group."""
    kernelspec = provisioner.kernel_spec
    name = getattr(provisioner.parent, "kernel_name", "") or kernelspec.display_name or "?"
    where = f"kernelspec {name!r}"

    def bad(key: str, problem: str, fix: str) -> errors.ConfigError:
        return errors.ConfigError(f"{where}: `{key}` {problem}; {fix}")

    if provisioner.backend not in backends.NAMES:
        raise bad(
            "backend",
            f"is {provisioner.backend!r}, which is not a backend",
            f"set it to one of {', '.join(repr(n) for n in backends.NAMES)}",
        )
    if not provisioner.queue:
        raise bad("queue", "is empty", "name the queue to wait in, such as 'default'")
    if provisioner.gpus < 0:
        raise bad("gpus", f"is {provisioner.gpus}", "ask for 0 or more GPUs")
    if provisioner.pod_group_size < 1:
        raise bad("pod_group_size", f"is {provisioner.pod_group_size}", "use 1 or more pods")
    if provisioner.admission_timeout < 0:
        raise bad("admission_timeout", "is negative", "use seconds, or 0 to wait forever")
    if provisioner.connect not in CONNECT_MODES:
        raise bad(
            "connect",
            f"is {provisioner.connect!r}",
            f"use one of {', '.join(repr(m) for m in CONNECT_MODES)}",
        )
    if provisioner.startup_timeout <= 0:
        raise bad("startup_timeout", "must be positive", "give the seconds a kernel may take")
    cpu = _quantity(provisioner.cpu, "cpu", quantities.millicores, bad)
    memory = _quantity(provisioner.memory, "memory", quantities.bytes_, bad)
    grace = _grace(provisioner.checkpoint, bad)
    checkpoint = _checkpoint(provisioner.checkpoint, provisioner.backend, bad)
    argv = _argv(list(kernelspec.argv) + list(argv_extra), kernelspec, provisioner.backend)
    if not argv:
        raise bad("argv", "is empty", "give the kernel command in kernel.json's argv")
    return GroupSpec(
        kernel_id=provisioner.kernel_id,
        name=group_name(provisioner.kernel_id),
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
        pod_template=dict(provisioner.pod_template),
        service_account=provisioner.service_account,
        connect=provisioner.connect,
        backend=provisioner.backend,
    )


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


def _quantity(value: Any, key: str, parse: Any, bad: Any) -> str | None:
    if value is None or value == "":
        return None
    try:
        if parse(value) < 0:
            raise ValueError(f"{value!r} is negative")
    except ValueError as exc:
        raise bad(
            key, f"is not valid ({exc})", "write a quantity such as 2, '500m' or '8Gi'"
        ) from None
    return str(value)


def _grace(checkpoint: dict[str, Any], bad: Any) -> float:
    unknown = sorted(set(checkpoint) - CHECKPOINT_KEYS)
    if unknown:
        raise bad(
            "checkpoint",
            f"has unknown keys {unknown}",
            f"use only {', '.join(sorted(CHECKPOINT_KEYS))}",
        )
    grace = checkpoint.get("grace_seconds", DEFAULT_GRACE_SECONDS)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace <= 0:
        raise bad("checkpoint.grace_seconds", f"is {grace!r}", "give a positive number of seconds")
    return float(grace)


def _checkpoint(config: dict[str, Any], backend: str, bad: Any) -> CheckpointSettings:
    enabled = config.get("enabled", bool(config.get("path") or config.get("claim")))
    for key in ("enabled", "keep"):
        if not isinstance(config.get(key, False), bool):
            raise bad(f"checkpoint.{key}", f"is {config[key]!r}", "write true or false")
    for key in ("path", "claim"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise bad(f"checkpoint.{key}", f"is {config[key]!r}", "write a string")
    if enabled and backend == "kubernetes" and not config.get("claim"):
        raise bad(
            "checkpoint.claim",
            "is missing",
            "name the PersistentVolumeClaim that holds checkpoints (ReadWriteMany is best: a "
            "requeued kernel may land on another node)",
        )
    return CheckpointSettings(
        enabled=bool(enabled),
        path=config.get("path"),
        claim=config.get("claim"),
        keep=bool(config.get("keep", False)),
    )


def _argv(argv: list[str], kernelspec: Any, backend: str) -> list[str]:
    """The kernel command with `{connection_file}` kept for the launcher to fill in."""
    resource_dir = getattr(kernelspec, "resource_dir", "") or ""
    argv = [arg.replace("{resource_dir}", resource_dir) for arg in argv]
    if backend == "local" and argv and argv[0] in _PYTHONS:
        argv[0] = sys.executable
    return argv
