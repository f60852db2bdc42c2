"""The pieces that make kubernetes releases complete: sentences for API failures, the owner id,
owned tasks, and the reaper's sweeps against the fake API server over HTTP."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue import errors
from kernel_queue.backends import tasks
from kernel_queue.kube import kueue
from kernel_queue.kube.client import explain
from kernel_queue.kube.client.api import Forbidden, Unavailable
from kernel_queue.kube.deletion.reaper import Reaper
from kernel_queue.kube.objects import ownership
from tests.fake_api import connected

NS = "default"
WHO = "kernel 1a2b3c4d"


# -- sentences ------------------------------------------------------------------------------


def test_an_rbac_refusal_names_the_identity_the_verb_the_resource_and_the_namespace() -> None:
    refused = Forbidden(
        403,
        "Forbidden",
        'pods is forbidden: User "system:serviceaccount:jupyter:kq" cannot create resource',
        verb="create",
        resource="pods",
        namespace="team-a",
    )
    failed = explain.failure(
        refused, who=WHO, doing="create its pod", after="; nothing was created"
    )
    assert isinstance(failed, errors.ClusterForbidden) and failed.status == 403
    assert str(failed) == (
        "kernel 1a2b3c4d: the server's service account 'jupyter/kq' may not create pods in "
        "namespace 'team-a'; grant it a Role in 'team-a' with verb 'create' on 'pods' bound to it "
        "(see etc/kubernetes/rbac.yaml), or use a namespace where it may; nothing was created"
    )
    cluster_wide = Forbidden(
        403, "Forbidden", 'User "alice" cannot', verb="get", resource="workloadpriorityclasses"
    )
    text = str(explain.failure(cluster_wide, who=WHO, doing="check"))
    assert "user 'alice' may not get workloadpriorityclasses (cluster-wide)" in text
    assert "a ClusterRole" in text


@pytest.mark.parametrize(
    ("error", "answer"),
    [
        pytest.param(Unavailable(500, "InternalError", "injected"), "kept answering 500", id="500"),
        pytest.param(Unavailable(429, "TooManyRequests", "x"), "kept answering 429", id="429"),
        pytest.param(Unavailable(0, "ConnectionError", "refused"), "could not be reached", id="0"),
        pytest.param(Unavailable(0, "Timeout", "slow"), "did not answer in time", id="timeout"),
    ],
)
def test_a_server_that_kept_failing_is_named_by_its_answer_not_its_raw_text(
    error: errors.ClusterUnavailable, answer: str
) -> None:
    text = str(explain.failure(error, who=WHO, doing="create its Secret kq-1a2b3c4d-key"))
    assert text.startswith("kernel 1a2b3c4d: could not create its Secret kq-1a2b3c4d-key: ")
    assert answer in text and "try again in a minute" in text
    assert error.message not in text


def test_other_answers_keep_the_servers_message() -> None:
    invalid = errors.ClusterApiError(422, "Invalid", 'Pod "x" is invalid: spec.containers')
    text = str(explain.failure(invalid, who=WHO, doing="create its pod x"))
    assert (
        text == 'kernel 1a2b3c4d: could not create its pod x: Pod "x" is invalid: spec.containers'
    )


# -- the owner id ---------------------------------------------------------------------------


def test_the_default_owner_is_the_host_and_the_servers_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "jupyter-alice.example.org")
    monkeypatch.delitem(sys.modules, "jupyter_server.serverapp", raising=False)
    assert ownership.default_owner().startswith("jupyter-alice-uid")

    class KernelGatewayApp:  # a sibling of ServerApp holds the shared singleton slot
        port = 8890

    class App:
        _instance = KernelGatewayApp()

        @classmethod
        def instance(cls) -> App:  # as traitlets does for a sibling's instance
            raise RuntimeError("An incompatible sibling of 'ServerApp' is already instantiated")

    fake = types.ModuleType("jupyter_server.serverapp")
    fake.ServerApp = App  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jupyter_server.serverapp", fake)
    assert ownership.default_owner() == "jupyter-alice-8890"


# -- owned tasks ----------------------------------------------------------------------------


async def test_owned_tasks_are_logged_once_when_they_fail_and_all_ended_at_aclose(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owned = tasks.Tasks(logging.getLogger("test"))

    async def fail() -> None:
        raise RuntimeError("boom")

    failing = owned.spawn(fail(), "fails")
    sleeping = owned.spawn(asyncio.sleep(3600), "sleeps")
    await asyncio.wait([failing])
    assert [r.getMessage() for r in caplog.records] == ["kernel-queue: fails failed"]
    await owned.aclose()
    assert sleeping.cancelled() and len(owned) == 0


# -- the reaper -----------------------------------------------------------------------------


def secret(name: str, kernel: str, owned_by: str) -> dict[str, Any]:
    labels = {kueue.KERNEL_ID_LABEL: kernel, kueue.OWNER_LABEL: owned_by}
    return {"metadata": {"name": name, "labels": labels}, "stringData": {"key": "k"}}


def names(fake: FakeCluster) -> list[str]:
    items, _ = fake.store.list_objects("", "secrets", NS)
    return sorted(i["metadata"]["name"] for i in items)


async def test_a_sweep_deletes_only_this_owners_unknown_kernels_seen_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with connected(tmp_path, kueue_crds=True) as (fake, api):
        for name, kernel, owned_by in [
            ("left", "k-left", "me"),
            ("alive", "k-alive", "me"),
            ("theirs", "k-theirs", "someone-else"),
        ]:
            fake.store.create("", "secrets", NS, secret(name, kernel, owned_by))
        reaper = Reaper(owner="me", known=lambda: {"k-alive"}, log=logging.getLogger("reaper"))
        with caplog.at_level(logging.INFO):
            assert await reaper.sweep(api, [NS]) == []  # seen once: it may be adopted yet
            fake.store.create("", "secrets", NS, secret("new", "k-new", "me"))
            assert await reaper.sweep(api, [NS]) == ["Secret left"]
        assert names(fake) == ["alive", "new", "theirs"]
        assert [r.getMessage() for r in caplog.records] == [
            "reaper: deleted Secret left in default (kernel kleft, unknown to this server)"
        ]
        assert await reaper.sweep(api, [NS]) == ["Secret new"]
        assert names(fake) == ["alive", "theirs"]


async def test_a_handed_over_release_is_retried_at_each_sweep_until_it_succeeds(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path, kueue_crds=True) as (fake, api):
        fake.store.create("", "secrets", NS, secret("held", "k-held", "me"))
        reaper = Reaper(owner="me", known=lambda: {"k-held"}, log=logging.getLogger("reaper"))
        attempts = []

        async def release(api: Any) -> list[str]:
            attempts.append(1)
            if len(attempts) == 1:
                raise Unavailable(503, "ServiceUnavailable", "down")
            await api.delete(kueue.SECRETS, NS, "held")
            return ["Secret held"]

        reaper.hand_over(NS, "k-held", "its release", release)
        assert await reaper.sweep(api, [NS]) == []  # failed again: kept
        assert reaper.pending == 1
        assert await reaper.sweep(api, [NS]) == ["Secret held"]
        assert reaper.pending == 0 and names(fake) == []


def test_an_admission_refusal_keeps_the_servers_sentence() -> None:
    refused = Forbidden(
        403,
        "Forbidden",
        'pods "kq-1a2b3c4d-head-0" is forbidden: error looking up service account '
        'default/kernels: serviceaccount "kernels" not found',
        verb="create",
        resource="pods",
        namespace="default",
    )
    text = str(explain.failure(refused, who=WHO, doing="create its pod kq-1a2b3c4d-head-0"))
    assert text == (
        "kernel 1a2b3c4d: could not create its pod kq-1a2b3c4d-head-0: "
        + refused.message
        + "; the kernelspec's `service_account` 'kernels' does not exist in namespace "
        "'default': create it (`kubectl create serviceaccount kernels -n default`) or fix "
        "`service_account` in the kernelspec"
    )
