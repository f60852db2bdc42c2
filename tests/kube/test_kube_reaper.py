"""The reaper, on both planes: what this server's owner id labels and no kernel of the server
knows is deleted, one INFO line each; another server's objects are never touched."""

from __future__ import annotations

import logging
import uuid

import pytest

from kernel_queue import model
from kernel_queue.kube.objects import manifests
from kernel_queue.model import ConnectionInfo, GroupSpec
from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import OWNER, gone, kube_spec, labelled, settled, wait_clean


def leave_behind(plane: Plane, owner: str, pods: int = 1) -> str:
    """The Secret, Service and pods a crashed server of `owner` left (with a group of several
    `pods`, their headless group Service too); return their kernel id."""
    kernel_id = str(uuid.uuid4())
    spec = GroupSpec(
        kernel_id=kernel_id,
        queue="user-queue",
        argv=("python", "-c", "pass"),
        connection=ConnectionInfo("", 0, 0, 0, 0, 0, key="k"),
        gpus=1,
        namespace="default",
        image="kernel-queue/test-kernel",
        pod_group_size=pods,
    )
    group = model.group_name(kernel_id)
    made = [manifests.secret(spec, owner=owner), manifests.service(spec, owner=owner)]
    if pods > 1:
        made.append(manifests.group_service(spec, owner=owner))
    made += manifests.pods(spec, group, 0, owner=owner)
    plane.apply(made)
    return kernel_id


async def test_the_reaper_deletes_this_servers_leftovers_and_never_another_servers(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mine = leave_behind(plane, OWNER, pods=2)  # a group of two: its group Service goes too
    theirs = leave_behind(plane, "another-server")
    everything = {"pods", "services", "secrets", "workloads"}

    async def made() -> bool:  # Kueue makes the Workloads
        return all(set(labelled(plane, k)) == everything for k in (mine, theirs))

    await server.wait_for(made, within=30)
    group = model.group_name(mine)
    # The pod is gone too (wait_clean), but Kueue may end it first once its Workload went: the
    # reaper names only what it deleted itself.
    said = (
        f"Workload {group}",
        f"Service {group}",
        f"Service {group}-group",
        f"Secret {group}-key",
    )

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("reaper:")]

    async def reported() -> bool:  # the log line comes a moment after the object is gone
        return all(
            any(w in line and "unknown to this server" in line for line in lines()) for w in said
        )

    with caplog.at_level(logging.INFO):
        running = await server.start(kube_spec(kernelspec, gpus=0))  # the backend starts
        assert (await settled(server, running))["live"]
        await wait_clean(server, plane, mine, within=30)
        await server.wait_for(reported, within=10, detail=lambda: "\n".join(lines()))
    assert set(labelled(plane, theirs)) == everything
    assert labelled(plane, running)["pods"]  # a kernel the server knows is left alone
    assert not any(theirs[:8] in line for line in lines())
    await server.shutdown(running)
    await gone(server, running)
    await wait_clean(server, plane, running)
