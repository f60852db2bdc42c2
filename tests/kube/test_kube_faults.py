"""The kubernetes backend under API faults, one at a time, on both planes (the real plane's faults
come from the FaultProxy in front of its API server): releases complete (or are handed to the
reaper), creates retry and take only their own objects, and every failure is a sentence."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import (
    a_sentence,
    gone,
    kube_spec,
    labelled,
    ours,
    settled,
    wait_clean,
)


async def queued_behind(server: Server, name: str) -> tuple[str, str]:
    """A running kernel holding the GPU, and a second one queued behind it."""
    holder = await server.start(name)
    assert (await settled(server, holder))["live"]
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")
    return holder, waiting


@pytest.mark.parametrize("status", [500, 503, 429])
@pytest.mark.parametrize("plural", ["workloads", "pods", "services", "secrets"])
async def test_a_shutdown_whose_delete_meets_a_server_error_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, plural: str, status: int
) -> None:
    kernel = await server.start(kube_spec(kernelspec))
    assert (await settled(server, kernel))["live"]
    plane.fail_next("delete", plural, status)
    await server.shutdown(kernel)
    await gone(server, kernel)
    await wait_clean(server, plane, kernel)
    assert plane.faults_pending == 0


@pytest.mark.parametrize("plural", ["workloads", "services", "secrets"])
async def test_a_cancel_whose_delete_meets_a_server_error_answers_no_500_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, plural: str
) -> None:
    holder, waiting = await queued_behind(server, kube_spec(kernelspec))
    plane.fail_next("delete", plural, 500)
    await server.shutdown(waiting)  # raises on any answer but 2xx
    await gone(server, waiting)
    await wait_clean(server, plane, waiting)
    assert plane.faults_pending == 0
    assert labelled(plane, holder)["pods"]
    await server.shutdown(holder)
    await wait_clean(server, plane, holder)


@pytest.mark.parametrize("backend_config", [{"api_retry_seconds": 0.5}])
async def test_a_release_that_keeps_failing_is_handed_to_the_reaper(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kernel = await server.start(kube_spec(kernelspec))
    assert (await settled(server, kernel))["live"]
    plane.fail_next("delete", "services", 500, count=8)

    def reaped() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("reaper: del")]

    async def said_so() -> bool:  # the line comes a moment after the Service is gone
        return any("Service" in line for line in reaped())

    with caplog.at_level(logging.INFO):
        await server.shutdown(kernel)
        await gone(server, kernel)  # the listing does not wait for the cluster to recover
        await wait_clean(server, plane, kernel)
        await server.wait_for(said_so, within=10, detail=reaped)
    assert plane.faults_pending == 0
    handed = [r for r in caplog.records if "reaper" in r.getMessage() and r.levelno >= 30]
    assert len(handed) == 1, [r.getMessage() for r in caplog.records]  # one warning, no traceback
    assert handed[0].exc_info is None


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param({"status": 500}, id="500"),
        pytest.param({"status": 429}, id="429-retry-after"),
        pytest.param({"status": 504, "after": True}, id="answer-lost-after-create"),
    ],
)
@pytest.mark.parametrize("plural", ["secrets", "services", "pods"])
async def test_a_transient_create_failure_is_retried_and_the_kernel_starts(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    plural: str,
    fault: dict[str, Any],
) -> None:
    plane.fail_next("create", plural, **fault)
    kernel = await server.start(kube_spec(kernelspec))
    model = await settled(server, kernel)
    assert model["live"], model["reason"]
    assert plane.faults_pending == 0
    await server.shutdown(kernel)
    await gone(server, kernel)
    await wait_clean(server, plane, kernel)


@pytest.mark.parametrize(
    ("plural", "word"),
    [("secrets", "Secret"), ("services", "Service"), ("pods", "pod")],
)
async def test_someone_elses_object_in_the_way_is_a_sentence_and_is_left_alone(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, plural: str, word: str
) -> None:
    plane.plant_next(plural, {"app": "not-a-kernel"})
    kernel = await server.start(kube_spec(kernelspec))
    model = await settled(server, kernel)
    assert not model["live"]
    reason = model["reason"]
    assert a_sentence(reason, kernel), reason
    assert f"a {word} named 'kq-" in reason and "already exists in namespace 'default'" in reason
    assert "is not this kernel's" in reason and "kubectl delete" in reason
    await wait_clean(server, plane, kernel)
    planted = plane.objects("", plural, "default", "app=not-a-kernel")
    assert len(planted) == 1  # someone else's: never deleted
    await server.shutdown(kernel)
    await gone(server, kernel)


@pytest.mark.parametrize("backend_config", [{"api_retry_seconds": 0.5}])
async def test_a_create_that_keeps_failing_is_a_sentence_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.fail_next("create", "pods", 500, count=100)
    plane.fail_next("delete", "secrets", 503)  # the clean-up meets a fault too
    kernel = await server.start(kube_spec(kernelspec))
    model = await settled(server, kernel)
    assert not model["live"]
    reason = model["reason"]
    assert a_sentence(reason, kernel), reason
    assert "could not create its pod" in reason, reason  # the first cause, not the clean-up's
    assert "kept answering 500 InternalError" in reason and "try again" in reason
    plane.clear_faults()
    await wait_clean(server, plane, kernel)
    assert plane.requests[("delete", "secrets")] >= 2  # met its fault, then retried
    await server.shutdown(kernel)
    await gone(server, kernel)


@pytest.mark.parametrize("status", [500, 429])
async def test_a_preempted_kernel_whose_replacement_create_fails_once_comes_back(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, status: int
) -> None:
    low = await server.start(kube_spec(kernelspec, "low", priority_class="low"))
    assert (await settled(server, low))["live"]
    plane.fail_next("create", "pods", status)
    high = await server.start(kube_spec(kernelspec, "high", priority_class="high"))
    assert (await settled(server, high))["live"]
    model = await server.wait_reason(low, "requeued in 'user-queue', position")
    assert model["execution_state"] != "dead"
    assert plane.faults_pending == 0  # the replacement pod's create met it
    await server.shutdown(high)
    assert (await server.execute(low, "1+1"))["data"] == "2"
    await server.shutdown(low)
    await gone(server, low, high)
    await wait_clean(server, plane, low, high)


async def test_interrupt_and_restart_of_a_queued_kernel_answer_and_keep_it_queued(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    holder, waiting = await queued_behind(server, kube_spec(kernelspec))
    interrupted = await server.fetch("api", "kernels", waiting, "interrupt", method="POST", body="")
    assert interrupted.code == 204
    restarted = await server.fetch("api", "kernels", waiting, "restart", method="POST", body="{}")
    assert restarted.code == 200
    assert json.loads(restarted.body)["id"] == waiting
    model = await server.model(waiting)  # still queued, with Kueue's reason after the place
    assert model["reason"].startswith("queued in 'user-queue', position 1 of 1, needs 1 GPU")
    await server.shutdown(holder)
    assert (await server.execute(waiting, "6*7"))["data"] == "42"  # admitted as usual
    await server.shutdown(waiting)
    await gone(server, holder, waiting)
    await wait_clean(server, plane, holder, waiting)
    assert ours(plane) == {}


async def test_a_cancel_is_one_info_line_and_a_failed_start_one_error_without_traceback(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = kube_spec(kernelspec)
    holder, waiting = await queued_behind(server, name)
    with caplog.at_level(logging.INFO):
        await server.shutdown(waiting)
        await gone(server, waiting)
        plane.plant_next("secrets", {"app": "not-a-kernel"})
        failed = await server.start(name)
        assert not (await settled(server, failed))["live"]
    about = {k: [r for r in caplog.records if k[:8] in r.getMessage()] for k in (waiting, failed)}
    assert [r for r in about[waiting] if r.exc_info or r.levelno >= logging.WARNING] == []
    assert any("shut down while waiting" in r.getMessage() for r in about[waiting])
    errors = [r for r in about[failed] if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None, [r.getMessage() for r in errors]
    assert "is not this kernel's" in errors[0].getMessage()
    await server.shutdown(failed)
    await server.shutdown(holder)
    await gone(server, holder, failed)
    await wait_clean(server, plane, holder, waiting, failed)


async def test_aclose_leaves_no_task_of_the_backend_running(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    import asyncio

    from kernel_queue import backends
    from kernel_queue.backends import tasks

    holder, waiting = await queued_behind(server, kube_spec(kernelspec))  # a position reader
    await server.shutdown(waiting)
    await server.shutdown(holder)
    await gone(server, holder, waiting)

    def ours_running() -> list[str]:
        return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(tasks.PREFIX)]

    assert "kernel-queue: reaper" in ours_running()
    await backends.aclose_all(server.app.kernel_manager)
    assert ours_running() == []
    await wait_clean(server, plane, holder, waiting)
