"""Kernel ids a client chooses, on the kubernetes backend: two ids that share their first eight
hex digits are two kernels with objects of their own, and a hostile id creates nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import kube_spec, labelled, ours, wait_clean

TWIN_A = "1a2b3c4d-0000-4000-8000-00000000000a"  # the first eight hex digits shared
TWIN_B = "1a2b3c4d-0000-4000-8000-00000000000b"


async def test_two_kernels_whose_ids_share_eight_hex_digits_have_their_own_objects(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    name = kube_spec(kernelspec, gpus=0)
    assert await server.start(name, TWIN_A) == TWIN_A
    assert (await server.execute(TWIN_A, "secret = 'only in a'; 1", within=120))["data"] == "1"
    assert await server.start(name, TWIN_B) == TWIN_B
    assert (await server.execute(TWIN_B, "secret", within=120))["error"] == "NameError"
    a, b = labelled(plane, TWIN_A), labelled(plane, TWIN_B)
    for plural in ("pods", "services", "secrets"):
        assert a[plural] and b[plural] and not set(a[plural]) & set(b[plural]), (a, b)
    await server.shutdown(TWIN_A)
    await wait_clean(server, plane, TWIN_A)
    assert (await server.execute(TWIN_B, "2 + 2"))["data"] == "4"  # the other one runs on
    await server.shutdown(TWIN_B)
    await wait_clean(server, plane, TWIN_B)


@pytest.mark.parametrize("kernel_id", ["../victim", "1A2B3C4D-0000-4000-8000-00000000000A"])
async def test_a_hostile_kernel_id_is_refused_and_creates_nothing_in_the_cluster(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, kernel_id: str
) -> None:
    started = await server.start(kube_spec(kernelspec, gpus=0), kernel_id)
    model: dict[str, Any] = {}

    async def dead() -> bool:
        models = json.loads((await server.fetch("api", "kernels", method="GET")).body)
        model.update(next(m for m in models if m["id"] == started))
        return model.get("execution_state") == "dead"

    await server.wait_for(dead)
    assert "is not a lowercase UUID" in model["reason"], model
    assert ours(plane) == {}
    await server.app.kernel_manager.shutdown_all()
