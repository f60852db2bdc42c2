"""Compatibility: the `fake_cluster` pytest fixture of `kernel_queue_fake_cluster.plugin`.

`pytest_plugins = ["kernel_queue.testing.plugin"]` keeps working where the distribution
`kernel-queue-fake-cluster` is installed; new conftests name `kernel_queue_fake_cluster.plugin`.
"""

from __future__ import annotations

from kernel_queue.testing import NOT_INSTALLED

try:
    from kernel_queue_fake_cluster.plugin import fake_cluster
except ModuleNotFoundError as exc:
    if exc.name != "kernel_queue_fake_cluster":
        raise
    raise ImportError(NOT_INSTALLED, name="kernel_queue_fake_cluster") from exc

__all__ = ["fake_cluster"]
