"""`GET /api/kernel-queue/queues`: what the JupyterLab panel shows of each queue (capacity,
use, who holds it, who waits), from a real server with real kernels on one GPU; and the
pure views for the machine's other kernels and for Kueue's LocalQueue status."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from kernel_queue.kube.queueing import capacity, kueue_versions
from kernel_queue.server import queues
from tests.conftest import KernelspecFactory, Server


async def queue_listing(server: Server, **kwargs: Any) -> dict[str, Any]:
    response = await server.fetch("api", "kernel-queue", "queues", method="GET", **kwargs)
    return dict(json.loads(response.body))


async def start_in_notebook(server: Server, kernel: str, path: str) -> str:
    """POST a session, as JupyterLab does when it opens a notebook."""
    body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": kernel}}
    response = await server.fetch("api", "sessions", method="POST", body=json.dumps(body))
    return str(json.loads(response.body)["kernel"]["id"])


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0"], "queues": ["gpu", "batch"]}


async def test_the_holder_with_its_notebook_and_idle_time_and_the_waiting_kernel(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    holder = await start_in_notebook(server, name, "work/first.ipynb")
    assert (await server.execute(holder, "1+1"))["data"] == "2"
    waiting = await server.start(name)  # through the API: no notebook
    await server.wait_reason(waiting, "position 1 of 1")

    body = await queue_listing(server)
    assert body["backend"] == "local"
    by_name = {q["name"]: q for q in body["queues"]}
    assert set(by_name) == {"gpu", "batch"}  # every configured queue, even an empty one
    gpu = by_name["gpu"]
    assert gpu["capacity"] == {"gpus": 1}
    assert gpu["in_use"] == {"gpus": 1}
    assert gpu["shared"] is True
    assert [r["kernel_id"] for r in gpu["holders"]] == [holder]
    row = gpu["holders"][0]
    assert row["notebook"] == "work/first.ipynb"
    assert row["gpus"] == 1 and row["state"] == "running" and row["here"] is True
    idle = datetime.datetime.fromisoformat(row["idle_since"])
    assert idle <= datetime.datetime.now(datetime.UTC)
    assert [r["kernel_id"] for r in gpu["waiting"]] == [waiting]
    assert gpu["waiting"][0]["notebook"] is None
    assert gpu["waiting"][0]["position"] == 1
    assert gpu["waiting"][0]["waiting_since"]
    assert by_name["batch"] == {**by_name["batch"], "holders": [], "waiting": []}
    assert by_name["batch"]["in_use"] == {"gpus": 1}  # one pool for every local queue

    # "Leave queue" is DELETE /api/kernels/<id>: the waiting list is empty at once.
    await server.shutdown(waiting)
    gpu = {q["name"]: q for q in (await queue_listing(server))["queues"]}["gpu"]
    assert gpu["waiting"] == []
    await server.shutdown_and_wait(holder)


async def test_the_queues_need_the_token(server: Server) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await queue_listing(server, headers={"Authorization": "token wrong"})
    assert refused.value.code == 403


def test_another_process_on_the_machine_holds_the_gpu_without_a_notebook_name() -> None:
    machine = {
        "service": {"pid": 1, "version": "1", "system": False},
        "gpus": ["0", "1"],
        "gpus_in_use": 2,
        "kernels": [
            {"kernel_id": "", "queue": "gpu", "state": "admitted", "devices": ["1"],
             "position": 0, "uid": 1001, "pid": 0, "user": "alice", "gpus": 1, "here": False},
            {"kernel_id": "abc", "queue": "gpu", "state": "queued", "devices": [],
             "position": 1, "uid": 1000, "pid": 42, "user": "me", "gpus": 1, "here": False},
        ],
        "hidden": {"queued": 3},
    }  # fmt: skip
    view = queues.local_view({}, machine, ["gpu"], gpus=None)
    (gpu,) = view["queues"]
    assert gpu["capacity"] == {"gpus": 2} and gpu["in_use"] == {"gpus": 2}
    (alice,) = gpu["holders"]
    assert alice["user"] == "alice" and alice["notebook"] is None and alice["devices"] == ["1"]
    (mine,) = gpu["waiting"]
    assert mine["pid"] == 42 and mine["position"] == 1 and mine["here"] is False
    assert view["hidden"] == {"queued": 3}


def test_a_local_queue_status_gives_counts_and_gpus_in_use_and_no_capacity() -> None:
    local_queue = {
        "metadata": {"name": "gpu", "namespace": "team"},
        "spec": {"clusterQueue": "cq"},
        "status": {
            "pendingWorkloads": 4,
            "admittedWorkloads": 2,
            "flavorsUsage": [
                {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "total": "3"}]},
                {"name": "cpu", "resources": [{"name": "cpu", "total": "8"}]},
            ],
        },
    }
    view = kueue_versions.local_queue(local_queue, kueue_versions.V1BETA2)
    used = capacity.usage(view, "nvidia.com/gpu")
    assert used == capacity.Usage(pending=4, admitted=2, gpus=3)
    unread = capacity.missing("other", "team")
    answer = queues.kubernetes_view({}, {("lab", "gpu"): used, ("team", "other"): unread}, "lab")
    gpu, other = answer["queues"]
    assert (gpu["name"], gpu["capacity"], gpu["in_use"]) == ("gpu", None, {"gpus": 3})
    assert (gpu["namespace"], other["namespace"]) == ("lab", "team")
    assert (gpu["pending"], gpu["admitted"], gpu["error"]) == (4, 2, None)
    assert other["in_use"] is None and "pending" not in other
    assert other["error"].startswith("LocalQueue 'other' does not exist in namespace 'team'")


def test_a_v1beta1_local_queue_status_reads_the_same() -> None:
    local_queue = {
        "metadata": {"name": "gpu", "namespace": "team"},
        "status": {
            "pendingWorkloads": 1,
            "admittedWorkloads": 1,
            "flavorUsage": [
                {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "total": "1"}]}
            ],
        },
    }
    view = kueue_versions.local_queue(local_queue, kueue_versions.V1BETA1)
    assert capacity.usage(view) == capacity.Usage(pending=1, admitted=1, gpus=1)
