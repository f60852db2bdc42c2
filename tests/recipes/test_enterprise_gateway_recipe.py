"""etc/kubernetes/enterprise-gateway: Enterprise Gateway 3.x as a Deployment in the kernels'
namespace, its kernelspecs and config from ConfigMaps, the base's RBAC for its account. Rendered,
validated and applied with kubectl; its config kept alike with etc/jupyter's example; then EG (in
`.venv-eg`) started as the Deployment's pod would start, with only the account's token, runs a
queued kernel for a notebook server in gateway mode, on the RBAC-enforcing fake cluster."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster
from traitlets.config import Config

from kernel_queue.kube.objects import manifests
from tests.conftest import Server
from tests.gateway.conftest import gateway_client, jp_server_config, served  # noqa: F401 - fixtures
from tests.gateway.gateways import (
    GatewayProcess,
    enterprise_gateway_python,
    gateway_env,
)
from tests.ports import free_port
from tests.recipes import network, rendering
from tests.recipes.conftest import (
    labelled_in,
    lay_out_config_maps,
    namespace,
    recipe_cluster,
    shut_down_leaving_nothing,
    under,
)

NAMESPACE = "enterprise-gateway"
ACCOUNT = f"system:serviceaccount:{NAMESPACE}:kernel-queue"
ACCOUNT_TOKEN = "enterprise-gateway-token"
KERNELSPEC = "eg-gpu-queued"
APPLIED: list[str] = []
"""What `kubectl apply` said when the module's cluster got the recipe."""


def objects() -> tuple[rendering.Obj, ...]:
    return rendering.rendered("enterprise-gateway")  # see rendering.rendered


RECIPE = rendering.RECIPES / "enterprise-gateway"
EXAMPLE = rendering.RECIPES.parent / "jupyter" / "enterprise_gateway_config.py"


def gateway_pod() -> tuple[rendering.Obj, rendering.Obj]:
    """The Deployment's pod template and its one container."""
    (deployment,) = rendering.of_kind(objects(), "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container


def kernel_image() -> str:
    """The image the recipe's kernelspec runs kernels in."""
    (specs,) = rendering.of_kind(objects(), "ConfigMap", "enterprise-gateway-kernelspecs")
    spec = json.loads(specs["data"][f"{KERNELSPEC}.json"])
    return str(spec["metadata"]["kernel_provisioner"]["config"]["image"])


@pytest.fixture(scope="module")
def eg_python() -> Path:
    return enterprise_gateway_python()


@pytest.fixture(scope="module")
def cluster(module_root: Path, eg_python: Path) -> Iterator[FakeCluster]:
    """The RBAC-enforcing cluster of the module, the recipe applied by an admin with kubectl
    (what it said in `APPLIED`); the kernels' image runs with `.venv-eg`'s python (ipykernel
    6, as EG 3's kernels need)."""
    accounts, images = {ACCOUNT_TOKEN: ACCOUNT}, {kernel_image(): str(eg_python.parent)}
    with recipe_cluster(
        module_root / "rbac",
        accounts,
        objects(),
        APPLIED,
        made_first=[namespace(NAMESPACE)],
        image_paths=images,
    ) as fake:
        yield fake


def test_the_recipe_renders_and_every_object_passes_its_schema() -> None:
    assert rendering.kinds_and_names(objects()) == rendering.with_base(
        NAMESPACE,
        ("ConfigMap", "enterprise-gateway-config"),
        ("ConfigMap", "enterprise-gateway-kernelspecs"),
        ("Deployment", "enterprise-gateway"),
        ("PersistentVolumeClaim", "enterprise-gateway-sessions"),
        ("Service", "enterprise-gateway"),
    )
    assert {o["metadata"].get("namespace", NAMESPACE) for o in objects()} == {NAMESPACE}
    for obj in objects():
        rendering.validate(obj)
    pod, container = gateway_pod()
    assert pod["spec"]["serviceAccountName"] == "kernel-queue"
    # The sessions EG persists land on the claim, so a new gateway pod finds them.
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (sessions,) = [v for v in pod["spec"]["volumes"] if v["name"] == "sessions"]
    assert sessions["persistentVolumeClaim"]["claimName"] == "enterprise-gateway-sessions"
    assert mounts["sessions"] == env["EG_PERSISTENCE_ROOT"]


def loaded(path: Path) -> Config:
    """The traitlets config a config file makes."""
    config = Config()
    exec(compile(path.read_text(), str(path), "exec"), {"get_config": lambda: config})
    return config


def test_the_config_is_the_example_s_but_for_the_kernels_namespace() -> None:
    ours, example = loaded(RECIPE / "enterprise_gateway_config.py"), loaded(EXAMPLE)
    assert example.KubernetesBackend.pop("namespace") == "jupyter-kernels"
    assert "KubernetesBackend" not in ours or not ours.KubernetesBackend
    example.pop("KubernetesBackend")
    assert ours == example


def test_kubectl_applies_the_recipe(cluster: FakeCluster) -> None:
    assert len(APPLIED) == len(objects()), APPLIED
    assert all(line.endswith(" created") for line in APPLIED), APPLIED
    assert "deployment.apps/enterprise-gateway created" in APPLIED


@pytest.fixture
def gateway(
    cluster: FakeCluster,
    eg_python: Path,
    tmp_path: Path,
    jp_asyncio_loop: asyncio.AbstractEventLoop,
) -> Iterator[GatewayProcess]:
    """EG started as the Deployment's container: its command and environment, its ConfigMaps
    laid out under a directory standing for the container's `/`, the pod's namespace
    (KERNEL_QUEUE_NAMESPACE stands in for its service-account namespace file), the account's
    token as its only credentials; on 127.0.0.1 and a free port instead of 0.0.0.0:8888."""
    root = tmp_path / "gateway-pod"
    pod, container = gateway_pod()
    env = lay_out_config_maps(objects(), pod["spec"], container, root)
    command = container["command"]
    assert command[:2] == ["jupyter", "enterprisegateway"]
    options = [
        f"--config={under(root, a.removeprefix('--config='))}" if a.startswith("--config=") else a
        for a in command[2:]
    ]
    port = free_port()
    kubeconfig = cluster.kubeconfig_for(ACCOUNT_TOKEN, namespace=NAMESPACE, name="gateway")
    argv = [
        str(eg_python.parent / "jupyter-enterprisegateway"),
        *options,
        f"--KubernetesBackend.kubeconfig={kubeconfig}",
        "--KubernetesBackend.position_interval=0.2",
    ]
    home = tmp_path / "gateway-home"
    home.mkdir()
    gateway = GatewayProcess(
        argv,
        gateway_env(
            home,
            **{
                **env,
                "EG_IP": "127.0.0.1",
                "EG_PORT": str(port),
                "JUPYTER_PATH": str(under(root, env["JUPYTER_PATH"])),
                "EG_PERSISTENCE_ROOT": str(under(root, env["EG_PERSISTENCE_ROOT"])),
                "KERNEL_QUEUE_NAMESPACE": NAMESPACE,
            },
        ),
        port,
        home / "enterprise-gateway.log",
    )
    yield from served(gateway, jp_asyncio_loop)


async def test_the_gateway_runs_a_queued_kernel_with_the_account_s_token(
    server: Server, cluster: FakeCluster, gateway: GatewayProcess, tmp_path: Path
) -> None:
    kernel = await server.start(KERNELSPEC)
    result = await server.execute(kernel, "import ipykernel; 6 * 7, ipykernel.__version__[0]")
    assert result["data"] == "(42, '6')", (result, gateway.log()[-3000:])
    # EG keeps the session where the Deployment's environment says, on the sessions claim.
    _, container = gateway_pod()
    (root,) = [e["value"] for e in container["env"] if e["name"] == "EG_PERSISTENCE_ROOT"]
    sessions = under(tmp_path / "gateway-pod", root) / "kernel_sessions"
    assert (sessions / f"{kernel}.json").is_file(), sorted(sessions.glob("*"))
    pods, _ = cluster.call(
        cluster.store.list_objects,
        "",
        "pods",
        NAMESPACE,
        labels=f"kernel-queue.dev/kernel-id={kernel}",
    )
    (head,) = pods
    (policy,) = rendering.of_kind(objects(), "NetworkPolicy")
    gateway = network.Pod(NAMESPACE, gateway_pod()[0]["metadata"]["labels"])
    for port in manifests.KERNEL_PORTS.values():
        assert network.ingress_allowed([policy], gateway, network.Pod.of(head), port)
    await shut_down_leaving_nothing(server, kernel, lambda: labelled_in(cluster, NAMESPACE, kernel))
