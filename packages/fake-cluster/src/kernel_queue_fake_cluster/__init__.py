"""A fake Kubernetes cluster with Kueue, for tests and demos: a real HTTP API server on
127.0.0.1, Kueue's pod-group controller and scheduler, and a node agent that runs pods as local
processes (against this API server or a real one, over HTTP).

Three wings, each a subpackage: `apiserver` (the store and its HTTP server, admission, RBAC,
CRDs, the Endpoints controller), `node` (the node agent: its API client, pod binding, start-up
and status, Service forwarding) and `kueue` (the pod webhook, group reconciler, scheduler and
visibility API), with the pure code they share in `common`. `FakeCluster` (`cluster.py`)
composes them, as one Kueue release (`kueue/releases.py`: 0.14, 0.19 or 0.20); `plugin.py` is
a pytest plugin with a `fake_cluster` fixture. Kueue's CRDs come from the caller or
$KERNEL_QUEUE_FAKE_CLUSTER_CRDS (`apiserver/crds.py`); `CrdsNotFound` says how to give them when
neither does, `CrdsMismatch` which ones a release needs when others are given.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CrdsMismatch", "CrdsNotFound", "FakeCluster"]


def __getattr__(name: str) -> Any:
    if name == "FakeCluster":
        from kernel_queue_fake_cluster.cluster import FakeCluster

        return FakeCluster
    if name == "CrdsMismatch":
        from kernel_queue_fake_cluster.kueue.releases import CrdsMismatch

        return CrdsMismatch
    if name == "CrdsNotFound":
        from kernel_queue_fake_cluster.apiserver.crds import CrdsNotFound

        return CrdsNotFound
    raise AttributeError(f"module 'kernel_queue_fake_cluster' has no attribute {name!r}")
