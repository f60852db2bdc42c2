"""What the real control plane is made of: the pinned releases, and what differs between Kueue's.

Kubernetes and etcd are one release each; Kueue is two: the oldest release we support that
serves only `kueue.x-k8s.io/v1beta1` (0.14) and the newest the Go module proxy serves (0.19;
0.20 is not served there: `go mod download sigs.k8s.io/kueue@v0.20.0` answers "403 Forbidden:
This module version is not available"). Each Kueue release's CRDs and webhook manifests come
from that release's own module, never from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

KUBERNETES = "v1.36.3"
"""kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (k8s.io/kubernetes)."""
ETCD = "v3.6.16"
"""etcd's server (go.etcd.io/etcd/server/v3); Kubernetes 1.31+ needs 3.5.11+ (Debian 12 has
3.4.23)."""
GO_MINIMUM = (1, 26)
"""Kueue 0.18+ needs Go 1.26 (its config defaults use `new(expr)`)."""


@dataclass(frozen=True)
class KueueRelease:
    """One Kueue release as the control plane runs it."""

    name: str
    """"0.14", "0.19": the release line, as the tests name releases."""
    version: str
    """The module version built (`sigs.k8s.io/kueue@version`)."""
    config_api: str
    """The Configuration's apiVersion (v1beta1 up to 0.14, v1beta2 from 0.15)."""
    visibility_port: int | None
    """The visibility server's fixed port where the release cannot be told another
    (0.14 listens on 8082 on every address); None: configurable (`visibilityServer`)."""
    visibility_in_cluster: bool
    """The visibility server authenticates its callers only with in-cluster credentials
    (0.14: `KUBERNETES_SERVICE_HOST` and the service account's files); later releases take
    the manager's `--kubeconfig`."""

    @property
    def module(self) -> str:
        return f"sigs.k8s.io/kueue@{self.version}"


KUEUE = {
    "0.14": KueueRelease("0.14", "v0.14.8", "config.kueue.x-k8s.io/v1beta1", 8082, True),
    "0.19": KueueRelease("0.19", "v0.19.2", "config.kueue.x-k8s.io/v1beta2", None, False),
}
"""The Kueue releases the real plane runs, by release line."""


def kueue(name: str) -> KueueRelease:
    """The release `name` ("0.14", "0.19"); a ValueError naming the choices otherwise."""
    try:
        return KUEUE[name]
    except KeyError:
        choices = ", ".join(sorted(KUEUE))
        raise ValueError(
            f"the real control plane runs Kueue {choices}, not {name!r}; pick one of those"
        ) from None
