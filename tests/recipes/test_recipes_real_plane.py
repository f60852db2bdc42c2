"""Every recipe under etc/kubernetes on the real API server: applied with `kubectl apply` of the
plane's own Kubernetes release (server-side field validation, strict) as an admin, after what
the platform makes first; then a kernel-queue server holding only the token of the service
account the recipe grants (from the TokenRequest API) runs a queued kernel end to end, the real
Kueue admitting it and the node agent running it, and leaves nothing when it is shut down. A
Role short of one verb fails the kernel naming it, with the real RBAC authorizer's refusal.

The recipes' NetworkPolicies are stored and validated here but enforced by nothing (no network
plugin runs); `test_base.py` and its neighbours read what they let through.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kernel_queue_fake_cluster.control_plane.fault_proxy import FaultProxy

from tests.conftest import KernelspecFactory, Server, real_plane_ready
from tests.kube.planes import RealPlane, RealPlanes, stop_kernels
from tests.recipes import rendering
from tests.recipes.conftest import (
    ALL_OF_A_KERNEL,
    FIXTURES,
    failed_for_want_of_creating_services,
    namespace,
    served_with,
    shut_down_leaving_nothing,
)

RELEASE = "0.19"


@dataclass(frozen=True)
class Recipe:
    name: str
    namespace: str
    account: str
    made_first: tuple[dict[str, Any], ...] = ()
    crds: tuple[str, ...] = ()
    """Test-only CRDs of tests/recipes/fixtures the recipe's objects need."""


def _account(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": ns},
    }


RECIPES = {
    "base": Recipe("base", "default", "kernel-queue"),
    "kubeflow": Recipe(
        "kubeflow",
        "kubeflow-user-example-com",
        "default-editor",
        # Kubeflow's profile controller makes the namespace and default-editor
        made_first=(
            namespace("kubeflow-user-example-com"),
            _account("kubeflow-user-example-com", "default-editor"),
        ),
        crds=("notebooks.kubeflow.org.yaml",),
    ),
    "jupyterhub": Recipe("jupyterhub", "jupyterhub", "kernel-queue", (namespace("jupyterhub"),)),
    "enterprise-gateway": Recipe(
        "enterprise-gateway",
        "enterprise-gateway",
        "kernel-queue",
        (namespace("enterprise-gateway"),),
    ),
}


@pytest.fixture
def recipe(request: pytest.FixtureRequest) -> Recipe:
    return RECIPES[request.param]


@pytest.fixture
def plane(
    real_planes: RealPlanes, jp_asyncio_loop: asyncio.AbstractEventLoop, recipe: Recipe
) -> Iterator[RealPlane]:
    """The session's real plane (Kueue 0.19), back to its first state, the recipe applied as
    its admin with kubectl; this test's FaultProxy in front of it, which the server goes
    through with the recipe's token."""
    real_plane_ready()
    control = real_planes.plane(RELEASE)
    token = real_planes.server_token(RELEASE)
    proxy = jp_asyncio_loop.run_until_complete(FaultProxy(control.url, control.pki.ca.cert).start())
    objects = rendering.rendered(recipe.name)
    try:  # a reset or an apply that fails still closes the proxy's connections
        real = RealPlane(control, proxy, token)
        real.reset()
        made = [
            *(yaml.safe_load((FIXTURES / name).read_text()) for name in recipe.crds),
            *recipe.made_first,
        ]
        if made:
            control.admin.apply(made)
        applied = control.kubectl(
            "apply", "--validate=strict", "-f", "-", input=rendering.as_yaml(objects)
        )
        real.applied = applied.stdout.splitlines()  # type: ignore[attr-defined]
        real.server_token = control.service_account_token(recipe.namespace, recipe.account)
        yield real
        stop_kernels(jp_asyncio_loop)
    finally:
        jp_asyncio_loop.run_until_complete(proxy.stop())
        for obj in objects:  # what the recipe made outside its namespace
            if "namespace" not in obj["metadata"] and obj["kind"].startswith("Cluster"):
                control.kubectl(
                    "delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found"
                )


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any], plane: RealPlane, recipe: Recipe, tmp_path: Path
) -> dict[str, Any]:
    """The server with the recipe's token and nothing else, in the recipe's namespace."""
    kubeconfig = plane.server_kubeconfig(tmp_path)
    return served_with(jp_server_config, kubeconfig, "recipe-server", namespace=recipe.namespace)


def _made(plane: RealPlane, ns: str, kernel: str) -> dict[str, list[str]]:
    found = {}
    for plural in ("pods", "services", "secrets"):
        items = plane.objects("", plural, ns, f"kernel-queue.dev/kernel-id={kernel}")
        found[plural] = [i["metadata"]["name"] for i in items]
    found["workloads"] = [
        w["metadata"]["name"]
        for w in plane.objects("kueue.x-k8s.io", "workloads", ns)
        if w["metadata"]["name"].startswith(f"kq-{kernel.replace('-', '')[:8]}")
    ]
    return {k: v for k, v in found.items() if v}


def _kernelspec(kernelspec: KernelspecFactory, recipe: Recipe) -> str:
    return kernelspec(
        "recipe",
        backend="kubernetes",
        queue="user-queue",
        namespace=recipe.namespace,
        image="kernel-queue/test-kernel",
        gpus=1,
    )


@pytest.mark.parametrize("recipe", sorted(RECIPES), indirect=True)
async def test_the_recipe_applies_on_the_real_api_server_and_runs_a_kernel_with_its_grants(
    server: Server, kernelspec: KernelspecFactory, plane: RealPlane, recipe: Recipe
) -> None:
    applied = plane.applied  # type: ignore[attr-defined]
    assert len(applied) == len(rendering.rendered(recipe.name)), applied
    assert all(line.endswith((" created", " configured", " unchanged")) for line in applied)
    again = plane.control.kubectl(
        "apply", "-f", "-", input=rendering.as_yaml(rendering.rendered(recipe.name))
    )
    assert all(line.endswith(" unchanged") for line in again.stdout.splitlines()), again.stdout
    kernel = await server.start(_kernelspec(kernelspec, recipe))
    result = await server.execute(kernel, "import os; os.environ['KERNEL_ID'][:8]")
    assert result["data"] == repr(kernel[:8]), result
    assert sorted(_made(plane, recipe.namespace, kernel)) == ALL_OF_A_KERNEL
    await shut_down_leaving_nothing(server, kernel, lambda: _made(plane, recipe.namespace, kernel))


@pytest.mark.parametrize("recipe", ["kubeflow"], indirect=True)
async def test_a_role_short_of_one_verb_fails_the_kernel_naming_the_verb(
    server: Server, kernelspec: KernelspecFactory, plane: RealPlane, recipe: Recipe
) -> None:
    (role,) = rendering.of_kind(rendering.rendered(recipe.name), "Role")
    trimmed = json.loads(json.dumps(role))
    (services,) = [r for r in trimmed["rules"] if r["resources"] == ["services"]]
    services["verbs"].remove("create")
    plane.control.kubectl("apply", "-f", "-", input=rendering.as_yaml([trimmed]))
    kernel = await server.start(_kernelspec(kernelspec, recipe))

    async def dead() -> bool:
        return (await server.model(kernel))["execution_state"] == "dead"

    await server.wait_for(dead)
    reason = (await server.model(kernel))["reason"]
    ns = recipe.namespace
    await failed_for_want_of_creating_services(
        server, kernel, reason, f"{ns}/{recipe.account}", lambda: _made(plane, ns, kernel)
    )
