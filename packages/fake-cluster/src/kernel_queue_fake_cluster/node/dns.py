"""Cluster DNS for the pods the node runs: the names CoreDNS would answer, in hosts files that
each pod's processes read through nss_wrapper.

Pods here are local processes sharing this machine's resolver, and nothing here may change
/etc/hosts or /etc/resolv.conf. So the agent keeps one hosts file per namespace it runs pods in
(`<root>/dns/<namespace>/hosts`) and starts each container with `LD_PRELOAD` naming
libnss_wrapper (Debian's `libnss-wrapper`) and `NSS_WRAPPER_HOSTS` naming its namespace's file:
`getaddrinfo` and `gethostbyname` of any program in the pod (Python, C++, curl) read that file
first and fall back to this machine's resolver. Where the library is missing, the pods get
neither variable and cluster names do not resolve (the agent says so once).

The names, as Kubernetes' DNS specification gives them, with the search path a pod's
resolv.conf has (`<ns>.svc.<domain> svc.<domain> <domain>`) spelled out: a Service with a
ClusterIP is `<svc>.<ns>.svc.<domain>`, also `<svc>.<ns>.svc`, `<svc>.<ns>` and, in its own
namespace, `<svc>`; a pod with `spec.hostname` and `spec.subdomain` naming a headless Service
(`clusterIP: None`) of its namespace that selects it is `<hostname>.<subdomain>.<ns>.svc.
<domain>` (and the same shorter forms), while it is ready or the Service publishes not-ready
addresses, and has an IP (the agent's own pods have theirs before their processes start). Two
pods of one name (a replacement beside the pod it replaces) resolve to the one not being
deleted, else the newest. Not served: a headless Service's own name, SRV records, ExternalName.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from kernel_queue_fake_cluster.common import selectors
from kernel_queue_fake_cluster.common.objects import Obj
from kernel_queue_fake_cluster.common.pods import pod_ready, terminal

log = logging.getLogger(__name__)

CLUSTER_DOMAIN = "cluster.local"
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
LIBRARY = "libnss_wrapper.so"
INSTALL = "apt-get install libnss-wrapper"
"""How to get the library on Debian (the package that ships `LIBRARY`)."""


class Objects(Protocol):
    """Where the DNS reads Services or pods: an informer."""

    def objects(self) -> Iterator[Obj]: ...


def find_library() -> str | None:
    """The path of libnss_wrapper on this machine, or None."""
    for folder in LIBRARY_DIRS:
        path = os.path.join(folder, LIBRARY)
        if os.path.exists(path):
            return path
    return None


def names(name: str, namespace: str, own: bool, domain: str = CLUSTER_DOMAIN) -> list[str]:
    """The names `name` (a Service, or `<hostname>.<subdomain>`) of `namespace` answers to from a
    pod of the namespace (`own`) or of another one."""
    found = [f"{name}.{namespace}.svc.{domain}", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
    return [*found, name] if own else found


def records(
    services: Iterable[Obj],
    pods: Iterable[Obj],
    namespace: str,
    ip_of: Callable[[Obj], str | None],
    domain: str = CLUSTER_DOMAIN,
) -> list[tuple[str, list[str]]]:
    """(address, names) as a pod of `namespace` resolves them (see the module's docstring)."""
    found: list[tuple[str, list[str]]] = []
    headless: dict[tuple[str, str], Obj] = {}
    for service in services:
        meta, spec = service["metadata"], service.get("spec") or {}
        where, ip = meta.get("namespace", ""), spec.get("clusterIP")
        if spec.get("type") == "ExternalName":
            continue
        if ip == "None":
            headless[(where, meta["name"])] = service
        elif ip:
            found.append((str(ip), names(meta["name"], where, where == namespace, domain)))
    members: dict[tuple[str, str, str], Obj] = {}
    for pod in pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        where = meta.get("namespace", "")
        hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
        chosen = headless.get((where, str(subdomain)))
        if not hostname or chosen is None or terminal(pod) or not ip_of(pod):
            continue
        selector = (chosen.get("spec") or {}).get("selector")
        if not selector or not selectors.selector_dict({"matchLabels": selector})(pod):
            continue
        if not (chosen["spec"].get("publishNotReadyAddresses") or pod_ready(pod)):
            continue
        key = (where, str(subdomain), str(hostname))
        if key not in members or _rank(pod) > _rank(members[key]):
            members[key] = pod
    for (where, subdomain, hostname), pod in sorted(members.items()):
        ip = str(ip_of(pod))
        found.append((ip, names(f"{hostname}.{subdomain}", where, where == namespace, domain)))
    return found


def _rank(pod: Obj) -> tuple[bool, str]:
    """Which of two pods of one name answers: not being deleted, then the newest."""
    meta = pod["metadata"]
    return not meta.get("deletionTimestamp"), str(meta.get("creationTimestamp", ""))


def hosts_text(found: Iterable[tuple[str, list[str]]]) -> str:
    """A hosts(5) file of `found`, without comments (nss_wrapper refuses a file with any)."""
    return "".join(f"{ip} {' '.join(names)}\n" for ip, names in found)


class ClusterDns:
    """Keeps `<root>/dns/<namespace>/hosts` current for each namespace it `serves`, from the
    agent's Service and pod informers (`on_service`, `on_pod`) and the addresses it gave its
    own pods (`ip_of`). Writes happen on the loop, at most once per loop turn, and only when a
    file's text changes; each write replaces the file whole (nss_wrapper rereads it)."""

    def __init__(
        self,
        services: Objects,
        pods: Objects,
        root: Path,
        ip_of: Callable[[Obj], str | None],
        *,
        library: str | None = None,
        domain: str = CLUSTER_DOMAIN,
    ) -> None:
        self.services, self.pods, self.ip_of = services, pods, ip_of
        self.folder, self.library, self.domain = root / "dns", library, domain
        self._served: set[str] = set()
        self._written: dict[str, str] = {}
        self._scheduled: asyncio.Handle | None = None
        self._warned = False

    def env(self, namespace: str) -> dict[str, str]:
        """The variables a container of `namespace` starts with ({} without the library); its
        namespace's file is written now, so names (its own pod's too) resolve from the start."""
        if self.library is None:
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s not found: the pods cannot resolve cluster names (%s)", LIBRARY, INSTALL
                )
            return {}
        self._served.add(namespace)
        self._write(namespace)
        path = str(self.path(namespace))
        return {"LD_PRELOAD": self.library, "NSS_WRAPPER_HOSTS": path}

    def path(self, namespace: str) -> Path:
        """The hosts file of `namespace`."""
        return self.folder / namespace / "hosts"

    def on_service(self, kind: str, service: Obj) -> None:
        """A Service changed (an informer's handler)."""
        self.changed()

    def on_pod(self, kind: str, pod: Obj) -> None:
        """A pod changed (an informer's handler): only pods of a subdomain have names."""
        if (pod.get("spec") or {}).get("subdomain"):
            self.changed()

    def changed(self) -> None:
        """Rewrite the files that change, once this loop turn is over."""
        if self._scheduled is None and self._served:
            self._scheduled = asyncio.get_running_loop().call_soon(self._flush)

    def close(self) -> None:
        """Stop writing; remove the files."""
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        self._served.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _flush(self) -> None:
        self._scheduled = None
        for namespace in sorted(self._served):
            self._write(namespace)

    def _write(self, namespace: str) -> None:
        found = records(
            self.services.objects(), self.pods.objects(), namespace, self.ip_of, self.domain
        )
        text = hosts_text(found)
        if self._written.get(namespace) == text:
            return
        path = self.path(namespace)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.new")
            temporary.write_text(text)
            os.replace(temporary, path)
        except OSError as exc:
            log.warning("cannot write the hosts file %s: %s", path, exc)
            with contextlib.suppress(OSError):
                temporary.unlink()
            return
        self._written[namespace] = text
