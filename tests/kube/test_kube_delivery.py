"""The server delivers its launcher: a kernel runs on an image with Python and ipykernel only.

`kernelspecs/kubernetes-gpu-example` names `quay.io/jupyter/scipy-notebook`, which has no
kernel-queue; the fake kubelet runs that image with `.venv-bare` (ipykernel only), so the pod can
run nothing of ours but the archive the server put in its namespace's launcher ConfigMap. Images
without ipykernel or without Python fail in a sentence, leaving nothing but the shared ConfigMap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue.kube import kueue, launcher_archive
from tests.conftest import KernelspecFactory, Server
from tests.kube import images
from tests.kube.support import REPO, ours, wait_clean

EXAMPLE = REPO / "kernelspecs" / "kubernetes-gpu-example" / "kernel.json"
LAUNCHERS = f"{kueue.COMPONENT_LABEL}={kueue.LAUNCHER_COMPONENT}"


@pytest.fixture(scope="session")
def image_bins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Image pattern -> bin dir: the example's image, one without ipykernel, one without python."""
    root = tmp_path_factory.mktemp("images")
    return {
        images.EXAMPLE_IMAGE: str(images.bare_kernel_bin()),
        images.NO_IPYKERNEL_IMAGE: str(images.no_ipykernel_bin(root)),
        images.NO_PYTHON_IMAGE: str(images.no_python_bin(root)),
    }


@pytest.fixture
def cluster_options(image_bins: dict[str, str]) -> dict[str, Any]:
    return {"image_paths": image_bins}


def example_spec(jp_kernel_dir: Path, **changes: Any) -> str:
    """kernelspecs/kubernetes-gpu-example as shipped, in the test cluster's namespace and with
    its priority class (the sample queues have `low` and `high`, not `interactive`)."""
    spec = json.loads(EXAMPLE.read_text())
    config = spec["metadata"]["kernel_provisioner"]["config"]
    config.update(namespace="default", priority_class="low", **changes)
    folder = jp_kernel_dir / "kubernetes-gpu-example"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.json").write_text(json.dumps(spec))
    return "kubernetes-gpu-example"


def claim(cluster: FakeCluster, name: str) -> None:
    cluster.apply(
        f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}, namespace: default}}
spec:
  accessModes: [ReadWriteMany]
  resources: {{requests: {{storage: 10Gi}}}}
"""
    )


def launcher_configmaps(cluster: FakeCluster) -> list[str]:
    items, _ = cluster.store.list_objects("", "configmaps", None, labels=LAUNCHERS)
    return sorted(i["metadata"]["name"] for i in items)


async def test_the_example_kernelspec_runs_on_an_image_with_ipykernel_only(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, jp_kernel_dir: Path
) -> None:
    claim(cluster, "notebook-checkpoints")
    kernel = await server.start(example_spec(jp_kernel_dir))
    reply = await server.execute(kernel, "import sys; print(sys.prefix); 6 * 7", within=120)
    assert reply["data"] == "42"
    assert ".venv-bare" in reply["stream"]  # the image's python, not the server's
    bare = "import importlib.util as u; [m for m in ('numpy', 'blake3') if u.find_spec(m)]"
    assert (await server.execute(kernel, bare))["data"] == "[]"  # nothing of the server's

    (name,) = launcher_configmaps(cluster)
    assert name == launcher_archive.current().name
    pods, _ = cluster.store.list_objects("", "pods", "default", labels=f"{kueue.KERNEL_ID_LABEL}")
    (head,) = [p for p in pods if p["metadata"]["labels"].get(kueue.ROLE_LABEL) == "head"]
    container = head["spec"]["containers"][0]
    assert container["command"] == ["python", launcher_archive.PATH]
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel)
    assert ours(cluster) == {}
