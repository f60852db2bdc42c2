"""Compatibility: the fake cluster is its own distribution now, `kernel-queue-fake-cluster`
(package `kernel_queue_fake_cluster`, in `packages/fake-cluster/` of a checkout).

`kernel_queue.testing.FakeCluster` and the `kernel_queue.testing.plugin` pytest plugin still
work when it is installed; new code imports `kernel_queue_fake_cluster` itself. Nothing in
kernel_queue's production code imports this package, and kernel images never hold the fake.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NOT_INSTALLED", "FakeCluster"]

NOT_INSTALLED = (
    "the fake cluster is a distribution of its own, kernel-queue-fake-cluster, which is not "
    "installed; from a checkout of kernel-queue: pip install ./packages/fake-cluster"
)
"""What to say when `kernel_queue_fake_cluster` cannot be imported."""


def __getattr__(name: str) -> Any:
    if name == "FakeCluster":
        try:
            from kernel_queue_fake_cluster.cluster import FakeCluster
        except ModuleNotFoundError as exc:
            if exc.name != "kernel_queue_fake_cluster":
                raise
            raise ImportError(NOT_INSTALLED, name="kernel_queue_fake_cluster") from exc
        return FakeCluster
    raise AttributeError(f"module 'kernel_queue.testing' has no attribute {name!r}")
