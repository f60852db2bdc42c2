"""pytest plugin with a `fake_cluster` fixture.

Enable it with `pytest_plugins = ["kernel_queue_fake_cluster.plugin"]` in a conftest.py.
The fixture runs the cluster on its own loop in a thread, so it serves synchronous tests and
tests on any other event loop alike; reach its objects from a test with `fake_cluster.call()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_queue_fake_cluster.cluster import FakeCluster


@pytest.fixture
def fake_cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    """A started FakeCluster (Kueue and kubelet on) in a thread; stopped after the test."""
    cluster = FakeCluster(root_dir=tmp_path / "fake-cluster").start_in_thread()
    try:
        yield cluster
    finally:
        cluster.stop_in_thread()
