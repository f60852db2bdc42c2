"""What `jupyter kernel-queue install` checks a kernelspec's queue and priority class against.

For the local backend: the Jupyter server's own config, read as jupyter_server reads it
(`jupyter_config` and `jupyter_server_config`, `.py` and `.json`, on `jupyter_config_path()`),
into a `LocalBackend`, whose trait defaults apply where the files set nothing. For the
kubernetes backend: the cluster's LocalQueues and WorkloadPriorityClasses, through
`kube.client.api`, when a cluster can be reached; else a sentence saying what was not checked and
why. Each problem is an `InstallError` naming the option, what exists and the fix. Nothing is read
at import; the cluster is read by `cluster_check` only.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from jupyter_core.application import JupyterApp
from traitlets import TraitError
from traitlets.config import Config

from kernel_queue import errors
from kernel_queue.backends.kubernetes.settings import BackendSettings
from kernel_queue.backends.local import LocalBackend

NOT_CHECKED = "did not check"
"""How the sentence of a cluster check that could not be made begins."""
UNCHECKED = f"{NOT_CHECKED} --queue and --priority-class"
CLUSTER_TIMEOUT = 10.0
"""Seconds one request to the cluster may take: an unreachable cluster must not stall install."""


class InstallError(errors.ConfigError):
    """An option is invalid; nothing was written."""


class ServerConfigFiles(JupyterApp):
    """Finds and loads the config files a Jupyter server loads (its `config_file_name` is
    jupyter_server's, `jupyter_server_config`); never started."""

    name = "jupyter-server"


def server_config() -> tuple[Config, list[str]]:
    """The Jupyter server's config from its files, and the files it came from."""
    files = ServerConfigFiles()
    files.raise_config_file_errors = True
    try:
        files.load_config_file()
    except Exception as exc:
        raise InstallError(
            f"cannot read the Jupyter server's config ({exc}); fix the file, then install again"
        ) from exc
    return files.config, list(files.loaded_config_files)


def where(config: Config, setting: str, files: list[str]) -> str:
    """Where the value of `c.LocalBackend.<setting>` comes from, for a sentence."""
    section: Any = config.get("LocalBackend") or {}
    if setting in section and files:
        return f"c.LocalBackend.{setting} as set in {', '.join(files)}"
    return f"the default of c.LocalBackend.{setting}; no Jupyter server config file sets it"


def check_local(queue: str, priority_class: str) -> None:
    """`queue` is one of the local backend's queues and `priority_class` (if any) one of its
    classes, as the Jupyter server will configure them; else an `InstallError`."""
    config, files = server_config()
    try:
        backend = LocalBackend(config=config)
        queues, classes = list(backend.queues), dict(backend.priority_classes)
    except TraitError as exc:
        raise InstallError(
            f"the Jupyter server's config sets the local backend wrongly ({exc}); fix "
            f"c.LocalBackend in {', '.join(files) or 'its config file'}"
        ) from exc
    if queue not in queues:
        raise InstallError(
            f"--queue {queue!r} is not a queue of the local backend; its queues are "
            f"{', '.join(queues) or 'none'} ({where(config, 'queues', files)}). Pass one of "
            f"them, or add {queue!r} to c.LocalBackend.queues in jupyter_server_config.py"
        )
    if priority_class and priority_class not in classes:
        known = ", ".join(f"{name} ({value})" for name, value in sorted(classes.items()))
        raise InstallError(
            f"--priority-class {priority_class!r} is not a priority class of the local backend; "
            f"its classes are {known or 'none'} ({where(config, 'priority_classes', files)}). "
            f"Pass one of them, or add {priority_class!r} to c.LocalBackend.priority_classes "
            "in jupyter_server_config.py"
        )


def kubernetes_settings(namespace: str) -> BackendSettings:
    """The kubeconfig, context and namespace the server's kubernetes backend would use
    (`c.KubernetesBackend.*` in its config files, else the traits' defaults)."""
    config, _ = server_config()
    section: Any = config.get("KubernetesBackend") or {}
    chosen = {k: section[k] for k in ("kubeconfig", "context", "namespace") if k in section}
    settings = BackendSettings(**chosen)
    if namespace:
        settings.namespace = namespace
    return settings


def _missing_kubeconfig(settings: BackendSettings) -> str:
    """Why no credentials can be loaded, when no kubeconfig file exists and the command does
    not run in a pod ("" otherwise): the client would print a line of its own."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not settings.kubeconfig:
        return ""
    path = settings.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if os.path.exists(os.path.expanduser(path)):
        return ""
    return f"no kubeconfig at {path}; set KUBECONFIG to the cluster's, then install again"


def credentials(settings: BackendSettings) -> str:
    """Where the cluster's credentials come from, as `kube.client.api` looks for them."""
    if settings.kubeconfig:
        return f"the kubeconfig {settings.kubeconfig}"
    if os.environ.get("KUBECONFIG"):
        return f"the kubeconfig {os.environ['KUBECONFIG']} ($KUBECONFIG)"
    return "the pod's service account or ~/.kube/config"


def cluster_check(queue: str, priority_class: str, namespace: str) -> str:
    """Check the LocalQueue and the WorkloadPriorityClass on the cluster the server would use:
    an `InstallError` when either is missing there; else a sentence, either what was checked
    or that nothing was checked and why (no client, no credentials, no answer, not allowed)."""
    settings = kubernetes_settings(namespace)
    try:
        from kernel_queue.kube.client import api
    except ModuleNotFoundError as exc:
        return (
            f"{UNCHECKED} against a cluster: the kubernetes client is not installed "
            f"({exc.name}); pip install 'kernel-queue[kubernetes]'"
        )
    return asyncio.run(_look(api, settings, queue, priority_class))


async def _look(api: Any, settings: BackendSettings, queue: str, priority_class: str) -> str:
    from kernel_queue.kube.client import retries
    from kernel_queue.kube.objects import preflight

    ns, source = settings.namespace, credentials(settings)
    missing = _missing_kubeconfig(settings)
    if missing:
        return f"{UNCHECKED} against a cluster: {missing}"
    try:
        client = await api.KubernetesApi.connect(
            settings.kubeconfig,
            settings.context,
            request_timeout=CLUSTER_TIMEOUT,
            retry=retries.NEVER,
        )
    except errors.ConfigError as exc:
        return f"{UNCHECKED} against a cluster: {exc}"
    try:
        served = await preflight.Discovery(retries.NEVER).versions(client)
        await _find(client, served.local_queues, ns, queue, "--queue", "LocalQueue", source)
        if priority_class:
            await _find(
                client,
                served.workload_priority_classes,
                None,
                priority_class,
                "--priority-class",
                "WorkloadPriorityClass",
                source,
            )
    except errors.KueueNotInstalled as exc:
        raise InstallError(f"the cluster of {source}: {exc}") from exc
    except errors.ClusterForbidden as exc:
        return f"{UNCHECKED} against the cluster of {source}: not allowed ({exc})"
    except (errors.ClusterApiError, OSError, TimeoutError) as exc:
        return f"{UNCHECKED} against the cluster of {source}: it did not answer ({exc})"
    finally:
        await client.aclose()
    checked = f"LocalQueue {queue!r} in namespace {ns!r}"
    if priority_class:
        checked += f" and WorkloadPriorityClass {priority_class!r}"
    return f"{checked} found on the cluster of {source}"


async def _find(
    client: Any, kind: Any, ns: str | None, name: str, option: str, noun: str, source: str
) -> None:
    """`name` exists as a `kind` (in namespace `ns`); else an `InstallError` listing those
    that do."""
    try:
        await client.get(kind, ns, name)
    except errors.ClusterNotFound as exc:
        items, _ = await client.list(kind, ns)
        names = ", ".join(sorted(str(i["metadata"]["name"]) for i in items)) or "none"
        place = f" in namespace {ns!r}" if ns else ""
        plural = noun + ("es" if noun.endswith("s") else "s")
        there = f"{plural}{place}: {names}"
        raise InstallError(
            f"{option} {name!r}: no {noun} {name!r}{place} on the cluster of {source} ({there}). "
            f"Pass one of them, or create it (see etc/kubernetes/queues.yaml)"
        ) from exc
