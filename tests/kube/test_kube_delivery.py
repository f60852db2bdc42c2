"""The server delivers its launcher: a kernel runs on an image with Python and ipykernel only.

`kernelspecs/kubernetes-gpu-example` names `quay.io/jupyter/scipy-notebook`, which has no
kernel-queue; the fake kubelet runs that image with `.venv-bare` (ipykernel only), so the pod can
run nothing of ours but the archive the server put in its namespace's launcher ConfigMap. Images
without ipykernel or without Python fail in a sentence, leaving nothing but the shared ConfigMap.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue.kube import kueue
from kernel_queue.kube.objects import launcher_archive
from tests.checkpoint_scenario import BARE_CHECK, BARE_SETUP
from tests.conftest import KernelspecFactory, Server
from tests.kube import images
from tests.kube.support import RBAC, REPO, failure, kube_spec, ours, pvc, wait_clean

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


def launcher_configmaps(cluster: FakeCluster) -> list[str]:
    items, _ = cluster.store.list_objects("", "configmaps", None, labels=LAUNCHERS)
    return sorted(i["metadata"]["name"] for i in items)


async def test_the_example_kernelspec_runs_on_an_image_with_ipykernel_only(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, jp_kernel_dir: Path
) -> None:
    cluster.apply(pvc("notebook-checkpoints"))
    kernel = await server.start(example_spec(jp_kernel_dir))
    reply = await server.execute(kernel, "import sys; print(sys.prefix); 6 * 7", within=120)
    assert reply["data"] == "42"
    assert ".venv-bare" in reply["stream"]  # the image's python, not the server's
    bare = "import importlib.util as u; [m for m in ('numpy', 'blake3') if u.find_spec(m)]"
    assert (await server.execute(kernel, bare))["data"] == "[]"  # nothing of the server's

    (name,) = launcher_configmaps(cluster)
    assert name == launcher_archive.current().name
    second = await server.start(kube_spec(kernelspec, "second", gpus=0))
    assert (await server.execute(second, "2 + 2"))["data"] == "4"
    assert cluster.stats.requests[("create", "configmaps")] == 1  # one copy, not one per kernel
    await server.shutdown(second)
    pods, _ = cluster.store.list_objects(
        "", "pods", "default", labels=f"{kueue.KERNEL_ID_LABEL}={kernel}"
    )
    (head,) = [p for p in pods if p["metadata"]["labels"].get(kueue.ROLE_LABEL) == "head"]
    container = head["spec"]["containers"][0]
    assert container["command"] == ["python", launcher_archive.PATH]
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel, second)  # the second one may still be going
    assert ours(cluster) == {}


async def left_only_the_launcher(server: Server, cluster: FakeCluster, kernel: str) -> None:
    """Nothing of the kernel is left (no pod, Secret, Service, Workload); the shared launcher
    ConfigMap may stay."""
    await wait_clean(server, cluster, kernel, within=30)
    assert ours(cluster) == {}
    assert launcher_configmaps(cluster) == [launcher_archive.current().name]


async def test_an_image_without_python_fails_in_a_sentence_that_names_it(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    image = images.NO_PYTHON_IMAGE
    kernel, reason = await failure(server, kube_spec(kernelspec, image=image, startup_timeout=30))
    assert reason.startswith(f"kernel {kernel[:8]}"), reason
    assert f"image {image} cannot run the launcher" in reason, reason
    assert 'exec: "python": executable file not found in $PATH' in reason, reason
    assert "Python 3.10 or newer with ipykernel" in reason, reason
    await left_only_the_launcher(server, cluster, kernel)


async def test_an_image_without_ipykernel_fails_in_a_sentence_that_says_what_to_add(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    image = images.NO_IPYKERNEL_IMAGE
    kernel, reason = await failure(server, kube_spec(kernelspec, image=image, startup_timeout=30))
    assert f"image {image} has no ipykernel: no module named ipykernel in " in reason, reason
    assert "add ipykernel to the image" in reason, reason
    await left_only_the_launcher(server, cluster, kernel)


async def test_a_missing_launcher_config_map_fails_in_a_sentence_and_is_made_again(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    """Someone deleted the launcher ConfigMap after the server made it: the kernel's pod cannot
    mount it; the kernel fails naming it within startup_timeout, and the next kernel works."""
    first = await server.start(kube_spec(kernelspec))
    assert (await server.execute(first, "1 + 1"))["data"] == "2"
    await server.shutdown(first)
    await wait_clean(server, cluster, first)
    (name,) = launcher_configmaps(cluster)
    cluster.store.delete("", "configmaps", "default", name)
    kernel, reason = await failure(server, kube_spec(kernelspec, "again", startup_timeout=3))
    assert f'configmap "{name}" not found' in reason, reason
    assert "the launcher's ConfigMap" in reason, reason
    await wait_clean(server, cluster, kernel, within=30)
    assert ours(cluster) == {}
    back = await server.start(kube_spec(kernelspec, "third"))
    assert (await server.execute(back, "2 + 2"))["data"] == "4"
    assert launcher_configmaps(cluster) == [name]
    await server.shutdown(back)


async def test_a_kernel_on_an_ipykernel_only_image_is_preempted_saved_and_restored(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, jp_kernel_dir: Path
) -> None:
    """The example's checkpoints need dill, which the image lacks: the archive's own copy
    (bundled from the server's environment) saves a lambda and a class of the notebook, and
    without numpy nothing asks for it."""
    cluster.apply(pvc("notebook-checkpoints"))
    low = await server.start(
        example_spec(
            jp_kernel_dir,
            checkpoint={"enabled": True, "claim": "notebook-checkpoints", "grace_seconds": 30},
        )
    )
    assert (await server.execute(low, BARE_SETUP, within=120))["status"] == "ok"
    high = await server.start(kube_spec(kernelspec, "high", priority_class="high"))
    model = await server.wait_reason(low, "saved 5 variables")  # its termination message
    assert "; requeued in 'user-queue'" in model["reason"], model["reason"]
    assert (await server.execute(high, "1 + 1"))["data"] == "2"
    await server.shutdown(high)
    back = await server.execute(low, BARE_CHECK, within=120)
    assert back["data"] == repr((41, 32, 49, 25)), back
    assert "restored 5 variables" in back["stream"], back
    await server.shutdown(low)
    await wait_clean(server, cluster, low, high)


def stale_launcher(cluster: FakeCluster, name: str) -> None:
    """A launcher ConfigMap as a server of another version left it."""
    body = launcher_archive.configmap(launcher_archive.Archive(b"old launcher"), "default")
    body["metadata"]["name"] = name
    cluster.store.create("", "configmaps", "default", body)


async def test_the_reaper_deletes_launcher_config_maps_no_pod_uses_and_keeps_the_others(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    """An old version's ConfigMap no pod mounts goes; one another server's pod still mounts
    stays, and so does this server's own, used or not."""
    stale_launcher(cluster, "kq-launcher-0.0.9-000000000000")
    stale_launcher(cluster, "kq-launcher-0.0.8-111111111111")
    other = {
        "metadata": {
            "name": "another-servers-kernel",
            "labels": {
                kueue.MANAGED_BY_LABEL: kueue.MANAGED_BY,
                kueue.OWNER_LABEL: "another-server",
                kueue.KERNEL_ID_LABEL: "someone-elses",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "schedulingGates": [{"name": "held"}],  # never runs: only its volume matters
            "containers": [{"name": "kernel", "image": "x", "command": ["true"]}],
            "volumes": [
                {
                    "name": "kernel-queue-launcher",
                    "configMap": {"name": "kq-launcher-0.0.8-111111111111"},
                }
            ],
        },
    }
    cluster.store.create("", "pods", "default", other)
    kernel = await server.start(kube_spec(kernelspec))
    assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    current = launcher_archive.current().name
    await server.shutdown(kernel)

    async def swept() -> bool:
        return launcher_configmaps(cluster) == sorted([current, "kq-launcher-0.0.8-111111111111"])

    await server.wait_for(swept, within=30, detail=lambda: launcher_configmaps(cluster))
    cluster.store.delete("", "pods", "default", "another-servers-kernel")
    await server.wait_for(
        lambda: _only(cluster, current), within=30, detail=lambda: launcher_configmaps(cluster)
    )


async def _only(cluster: FakeCluster, name: str) -> bool:
    return launcher_configmaps(cluster) == [name]


async def test_a_planted_config_map_of_the_launchers_name_is_refused_before_anything_is_made(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    """Its name is the archive's, its bytes are not: kernels would run code the server did not
    send, so the kernel fails naming it and nothing is created."""
    stale_launcher(cluster, launcher_archive.current().name)
    kernel, reason = await failure(server, kube_spec(kernelspec))
    name = launcher_archive.current().name
    assert f"ConfigMap {name} in namespace 'default' does not hold" in reason, reason
    assert reason.startswith(f"kernel {kernel[:8]}"), reason
    assert "nothing was created" in reason, reason
    assert ours(cluster) == {}


def without_configmaps() -> list[dict[str, Any]]:
    """The Role of etc/kubernetes/rbac.yaml without its configmaps rule."""
    policy = copy.deepcopy([doc for doc in RBAC if doc["apiVersion"].startswith("rbac.")])
    for doc in policy:
        if doc["kind"] == "Role":
            doc["rules"] = [r for r in doc["rules"] if "configmaps" not in r["resources"]]
    return policy


@pytest.mark.parametrize("cluster_options", [{"rbac_objects": without_configmaps()}])
async def test_a_role_without_configmaps_fails_naming_the_verb_before_anything_is_made(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec))
    assert reason.startswith(f"kernel {kernel[:8]}"), reason
    assert "may not create configmaps in namespace 'default'" in reason, reason
    assert "nothing was created" in reason, reason
    assert ours(cluster) == {}
