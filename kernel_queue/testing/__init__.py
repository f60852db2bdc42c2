"""A fake Kubernetes cluster for tests: API server, Kueue pod-group controller, kubelet.

`FakeCluster` (in `cluster.py`) wires them together; `plugin.py` is a pytest plugin with a
`fake_cluster` fixture. Nothing in kernel_queue's production code imports this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FakeCluster"]


def __getattr__(name: str) -> Any:
    if name == "FakeCluster":
        from kernel_queue.testing.cluster import FakeCluster

        return FakeCluster
    raise AttributeError(f"module 'kernel_queue.testing' has no attribute {name!r}")
