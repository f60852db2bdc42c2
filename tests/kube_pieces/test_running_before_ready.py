"""What comes with a kubernetes kernel running before its pod is Ready: a relaunch waits for
its previous launch's pods to stop (the kernel's Service publishes a head before it is Ready,
so a new head beside a stopping one would share its clients with the kernel that is saving and
going), and the server's tries to reach started kernels stay within a budget."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernel_queue.backends.kubernetes import backend as kube_backend
from kernel_queue.backends.kubernetes import groups
from kernel_queue.backends.kubernetes.backend import KubernetesBackend

Obj = dict[str, Any]


class Pods:
    """The pod cache as the backend reads it: a group's pods by namespace and group name."""

    def __init__(self, pods: dict[tuple[str, str], list[Obj]]) -> None:
        self.by_group = pods

    def pods(self, namespace: str, name: str) -> list[Obj]:
        return list(self.by_group.get((namespace, name), []))


def pod(phase: str, *, gated: bool = False, grace: int = 30) -> Obj:
    gates = [{"name": "kueue.x-k8s.io/admission"}] if gated else []
    return {
        "metadata": {"name": "kq-1-head-0"},
        "spec": {"terminationGracePeriodSeconds": grace, "schedulingGates": gates},
        "status": {"phase": phase},
    }


async def test_a_relaunch_waits_until_the_previous_heads_stopped() -> None:
    backend = KubernetesBackend()
    stopping = pod("Running")
    backend._caches = Pods({("ns", "kq-old"): [stopping]})  # type: ignore[assignment]
    waiting = asyncio.ensure_future(backend._previous_stopped("ns", "kq-old"))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # the old head still saves within its grace
    stopping["status"]["phase"] = "Failed"
    await asyncio.wait_for(waiting, 2)


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param([], id="gone"),
        pytest.param([pod("Succeeded"), pod("Failed")], id="ended"),
        pytest.param([pod("Pending", gated=True)], id="never-admitted"),
    ],
)
async def test_a_relaunch_after_a_launch_that_has_nothing_running_goes_on_at_once(
    pods: list[Obj],
) -> None:
    backend = KubernetesBackend()
    backend._caches = Pods({("ns", "kq-old"): pods})  # type: ignore[assignment]
    await asyncio.wait_for(backend._previous_stopped("ns", "kq-old"), 0.5)


async def test_a_previous_head_that_never_stops_holds_the_relaunch_only_past_its_grace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kube_backend, "PREVIOUS_STOP_MARGIN", 0.2)
    backend = KubernetesBackend()
    backend._caches = Pods({("ns", "kq-old"): [pod("Running", grace=0)]})  # type: ignore[assignment]
    await asyncio.wait_for(backend._previous_stopped("ns", "kq-old"), 3)
    assert "pod group ns/kq-old still has pods" in caplog.text


@pytest.mark.parametrize(
    ("looking", "elapsed", "interval"),
    [
        pytest.param(1, 0.0, 0.01, id="one-look"),
        pytest.param(10, 0.5, 0.01, id="ten-at-full-speed"),
        pytest.param(100, 0.5, 0.1, id="a-hundred-share-1000-tries-a-second"),
        pytest.param(1, 10.0, 0.5, id="a-kernel-slow-to-listen"),
    ],
)
def test_the_server_looks_for_started_kernels_often_but_within_a_budget(
    looking: int, elapsed: float, interval: float
) -> None:
    assert groups.look_interval(looking, elapsed) == pytest.approx(interval)
