"""The real Kubernetes client connected to a fake API server (no kubelet, no Kueue controller),
for tests of the kube layer below the backend."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue.kube.client.api import KubernetesApi


@contextlib.asynccontextmanager
async def connected(
    tmp_path: Path, *, kueue_crds: bool = False
) -> AsyncIterator[tuple[FakeCluster, KubernetesApi]]:
    """A started fake API server under `tmp_path` and a client of it; both closed at the end,
    all of it within 60 s. `kueue_crds`: the test needs Kueue's CRDs (skipped without them,
    outside CI)."""
    if kueue_crds:
        from tests.conftest import KUEUE_CRDS, skip_unless_ci

        if not KUEUE_CRDS.exists():
            skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_CRDS}")
    async with (
        asyncio.timeout(60),
        FakeCluster(root_dir=tmp_path / "cluster", kubelet=False, kueue=False) as fake,
    ):
        api = await KubernetesApi.connect(fake.kubeconfig)
        try:
            yield fake, api
        finally:
            await api.aclose()
