"""Helpers of the recipe tests: a fake cluster (one per module) that serves Kueue (main's CRDs)
and the test-only CRDs of tests/recipes/fixtures, enforces RBAC, and knows the tokens of the
service accounts the module's recipe grants; `kubectl apply` of a rendered recipe as its admin;
what a kernel left in a namespace; the pods the backend builds; a pod's ConfigMap files."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.apiserver import rbac
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue import model
from kernel_queue.kube.objects import manifests
from kernel_queue.model import ConnectionInfo, GroupSpec
from tests.commands import ran
from tests.conftest import KUEUE_CRDS, Server, skip_unless_ci
from tests.kube.support import COPIED_LABELS, GPU_QUOTA, QUEUES
from tests.recipes import rendering, tls

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ADMIN_TOKEN = "recipe-admin-token"


def crds_dir(where: Path) -> Path:
    """A directory of Kueue's CRDs beside the test-only ones (links, nothing copied)."""
    if not KUEUE_CRDS.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_CRDS} (../shared is absent)")
    where.mkdir(parents=True, exist_ok=True)
    for source in [*KUEUE_CRDS.glob("*.yaml"), *FIXTURES.glob("*.yaml")]:
        (where / source.name).symlink_to(source)
    return where


_FRONTS: dict[FakeCluster, tuple[Path, Callable[[], None]]] = {}
"""Each started cluster's admin kubeconfig through its TLS front, and what closes the front."""


def start_cluster(root: Path, accounts: Mapping[str, str], **options: Any) -> FakeCluster:
    """A fake cluster that enforces RBAC, with the sample queues of etc/kubernetes/queues.yaml
    and a 1-GPU quota; `accounts` (token → user) are known besides an admin, whose kubeconfig
    (through a TLS front, `tls.py`) `kubectl_apply` uses. `options`: more FakeCluster arguments
    (`image_paths`). Stop it with `stop_cluster`."""
    tokens = {ADMIN_TOKEN: rbac.User("admin", ("system:masters",)), **accounts}
    crds = crds_dir(root / "crds")
    options = {"label_keys_to_copy": COPIED_LABELS, **options}
    fake = FakeCluster(root_dir=root / "cluster", crds=crds, tokens=tokens, **options)
    fake.start_in_thread()
    _FRONTS[fake] = tls.front(fake, ADMIN_TOKEN)
    fake.call(fake.apply, fake.for_release(QUEUES))
    assert fake.kueue is not None
    fake.call(fake.kueue.set_quota, "cluster-queue", "default-flavor", GPU_QUOTA)
    return fake


def stop_cluster(fake: FakeCluster) -> None:
    _, close = _FRONTS.pop(fake)
    close()
    fake.stop_in_thread()


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


@contextlib.contextmanager
def recipe_cluster(
    root: Path,
    accounts: Mapping[str, str],
    recipe: Sequence[rendering.Obj],
    applied: list[str],
    *,
    made_first: Sequence[dict[str, Any]] = (),
    **options: Any,
) -> Iterator[FakeCluster]:
    """`start_cluster`; then what the platform makes before its admin comes (`made_first`: a
    namespace, Kubeflow's profile account); then `recipe` applied by the admin with kubectl,
    what it said put in `applied`. Stopped at the end."""
    fake = start_cluster(root, accounts, **options)
    try:
        if made_first:
            fake.call(fake.apply, list(made_first))
        applied[:] = kubectl_apply(fake, rendering.as_yaml(tuple(recipe)))
        yield fake
    finally:
        stop_cluster(fake)


@pytest.fixture(scope="module")
def module_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recipe")


def kubectl_apply(cluster: FakeCluster, manifests: str, *extra: str) -> list[str]:
    """`kubectl apply -f -` of `manifests` as the cluster's admin, validation on (the fake
    serves the OpenAPI documents kubectl asks for, and strict field validation); kubectl's
    lines (the test fails with kubectl's own error when it fails)."""
    kubeconfig, _ = _FRONTS[cluster]
    home = kubeconfig.parent / "kubectl-home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
    done = ran([rendering.kubectl(), "apply", *extra, "-f", "-"], env=env, stdin=manifests)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


ALL_OF_A_KERNEL = ["pods", "secrets", "services", "workloads"]
"""What a running kernel has in its namespace, by plural, sorted."""


async def shut_down_leaving_nothing(
    server: Server, kernel: str, made: Callable[[], dict[str, list[str]]]
) -> None:
    """Shut the kernel down through the server and wait until `made()` (what of it is in the
    cluster) is empty."""
    await server.shutdown(kernel)
    await server.wait_for(lambda: not made(), what="nothing of the kernel left", detail=made)


def served_with(
    jp_server_config: dict[str, Any], kubeconfig: Path, owner_id: str, /, **settings: Any
) -> dict[str, Any]:
    """The server's config with a KubernetesBackend whose only credentials are `kubeconfig`'s,
    as owner `owner_id`, with queue positions every 0.2 s and `settings` beside."""
    jp_server_config["KubernetesBackend"] = {
        **settings,
        "kubeconfig": str(kubeconfig),
        "owner_id": owner_id,
        "position_interval": 0.2,
    }
    return jp_server_config


async def failed_for_want_of_creating_services(
    server: Server,
    kernel: str,
    reason: str,
    account: str,
    made: Callable[[], dict[str, list[str]]],
) -> None:
    """`reason` (of the dead kernel) names what the server's service account `account`
    ("namespace/name") lacks and how to grant it, and nothing of the kernel stays: `made()` (what
    of it is in the cluster) comes to be empty."""
    namespace = account.split("/")[0]
    assert reason.startswith(
        f"kernel {kernel[:8]}: the server's service account '{account}' may "
        f"not create services in namespace '{namespace}'; grant it a Role in '{namespace}' "
        "with verb 'create' on 'services' bound to it"
    ), reason
    await server.wait_for(lambda: not made(), what="nothing of the failed kernel left", detail=made)


def labelled_in(cluster: FakeCluster, namespace: str, kernel: str) -> dict[str, list[str]]:
    """What of the kernel is in `namespace`, by plural (empty ones dropped): its pods, Service
    and Secret (by the kernel-id label) and its group's Workloads."""

    def find() -> dict[str, list[str]]:
        found = {}
        for plural in ("pods", "services", "secrets"):
            items, _ = cluster.store.list_objects(
                "", plural, namespace, labels=f"kernel-queue.dev/kernel-id={kernel}"
            )
            found[plural] = [i["metadata"]["name"] for i in items]
        workloads, _ = cluster.store.list_objects("kueue.x-k8s.io", "workloads", namespace)
        prefix = model.group_name(kernel)
        found["workloads"] = [
            w["metadata"]["name"] for w in workloads if w["metadata"]["name"].startswith(prefix)
        ]
        return {k: v for k, v in found.items() if v}

    return cluster.call(find)


def kernel_pods(namespace: str, group_size: int = 2) -> list[dict]:
    """The pods the backend builds for a kernel (head and a worker), as manifests.py makes them."""
    spec = GroupSpec(
        kernel_id="1a2b3c4d-5e6f-4a0b-8c9d-0e1f2a3b4c5d",
        queue="user-queue",
        argv=("python", "-m", "ipykernel_launcher", "-f", "{connection_file}"),
        connection=ConnectionInfo("127.0.0.1", 0, 0, 0, 0, 0, key="k"),
        gpus=1,
        pod_group_size=group_size,
        namespace=namespace,
        image="registry.example/kernel:1.0",
    )
    return manifests.pods(spec, spec.name, 0)


def lay_out_config_maps(
    objects: tuple[rendering.Obj, ...], pod: rendering.Obj, container: rendering.Obj, root: Path
) -> dict[str, str]:
    """Write the files `container` of `pod` (a pod spec) sees from its ConfigMap volumes, under
    `root` as the container's `/`; return its environment (literal `env` values)."""
    for mount in container.get("volumeMounts") or ():
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        if "configMap" not in volume:
            continue
        (config_map,) = rendering.of_kind(objects, "ConfigMap", volume["configMap"]["name"])
        items = volume["configMap"].get("items") or [
            {"key": key, "path": key} for key in config_map["data"]
        ]
        for item in items:
            target = root / mount["mountPath"].lstrip("/") / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(config_map["data"][item["key"]])
    return {e["name"]: e["value"] for e in container.get("env") or () if "value" in e}


def under(root: Path, path: str) -> Path:
    """A container's absolute `path` as laid out under `root`."""
    return root / path.lstrip("/")
