"""`Informer` against the fake API server: one list+watch shared by every subscriber, a cache
that equals a fresh list after drops, expiries and errors, and no open watch after `aclose()`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from kernel_queue import errors
from kernel_queue.kube.client.api import PODS, KubernetesApi
from kernel_queue.kube.client.informer import Informer, Informers
from tests import polling
from tests.fake_api import connected

NS = "default"
Event = tuple[str, str, str | None]  # (type, name, old resourceVersion)
Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], None]


def pod(name: str, **labels: str) -> dict[str, Any]:
    container = {"name": "main", "image": "python"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container]},
    }


def recorder(events: list[Event]) -> Handler:
    def handler(event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        old_version = old["metadata"]["resourceVersion"] if old else None
        events.append((event_type, obj["metadata"]["name"], old_version))

    return handler


async def eventually(check: Callable[[], object], what: str, within: float = 10) -> None:
    """Let the informer's task (in this loop) update the memory `check` reads."""
    await polling.until(check, what, within=within, every=0.01)


@contextlib.asynccontextmanager
async def running(
    api: KubernetesApi, *handlers: Handler, **options: Any
) -> AsyncIterator[Informer]:
    """An informer on the pods of NS with these handlers, started, closed whatever happens."""
    async with contextlib.aclosing(Informer(api, PODS, NS, **options)) as informer:
        for handler in handlers:
            informer.add_handler(handler)
        await informer.start()
        yield informer


async def cache_equals_a_fresh_list(api: KubernetesApi, informer: Informer) -> None:
    items, _ = await api.list(PODS, NS)
    fresh = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in items}

    def same() -> bool:
        cached = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in informer.items()}
        return cached == fresh

    await eventually(same, "the cache equal to a fresh list")


async def test_the_first_sync_fills_the_cache_and_reads_cost_no_requests(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        for name in ("a", "b", "c"):
            await api.create(PODS, NS, pod(name))
        async with running(api) as informer:
            await eventually(lambda: fake.stats.watches == 1, "one watch stream open on the server")
            requests = sum(fake.stats.requests.values())
            assert sorted(i["metadata"]["name"] for i in informer.items()) == ["a", "b", "c"]
            assert informer.get("a") == await api.get(PODS, NS, "a")
            assert informer.get("missing") is None
            assert sum(fake.stats.requests.values()) == requests + 1  # only our api.get
            assert (informer.lists, informer.relists) == (1, 0)


async def test_changes_reach_handlers_with_the_old_object(tmp_path: Path) -> None:
    async with connected(tmp_path) as (_, api):
        events: list[Event] = []
        handler = recorder(events)
        async with running(api, handler) as informer:
            created = await api.create(PODS, NS, pod("a"))
            await api.patch(PODS, NS, "a", {"metadata": {"labels": {"x": "1"}}}, patch_type="merge")
            await api.delete(PODS, NS, "a", grace_seconds=0)
            await eventually(lambda: len(events) == 3, "three events handled")
            first = created["metadata"]["resourceVersion"]
            assert [e[:2] for e in events] == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
            assert events[0][2] is None and events[1][2] == first
            assert informer.get("a") is None

            informer.remove_handler(handler)
            await api.create(PODS, NS, pod("b"))
            await eventually(lambda: informer.get("b") is not None, "pod b in the cache")
            assert len(events) == 3


async def test_fifty_subscribers_share_one_list_and_one_watch(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        async with contextlib.aclosing(Informers()) as informers:
            shared = await asyncio.gather(*(informers.get(api, PODS, NS) for _ in range(50)))
            assert len({id(informer) for informer in shared}) == 1 and len(informers) == 1
            counts: list[int] = [0] * 50
            for index, informer in enumerate(shared):
                informer.add_handler(lambda *_, i=index: counts.__setitem__(i, counts[i] + 1))
            await api.create(PODS, NS, pod("a"))
            await eventually(lambda: all(counts), "every handler called")
            assert fake.stats.requests[("list", "pods")] == 1
            assert fake.stats.requests[("watch", "pods")] == 1
            assert (fake.stats.watches, fake.stats.peak_watches) == (1, 1)

            other = await informers.get(api, PODS, NS, label_selector="x=1")
            assert other is not shared[0]
            await eventually(
                lambda: fake.stats.watches == 2, "two watch streams open on the server"
            )  # its own stream, once listed
        await eventually(lambda: fake.stats.watches == 0, "no watch stream open on the server")


async def test_a_dropped_watch_resumes_without_losing_events(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        await api.create(PODS, NS, pod("kept"))
        await api.create(PODS, NS, pod("doomed"))
        events: list[Event] = []
        async with running(api, recorder(events)) as informer:
            await eventually(lambda: fake.stats.watches == 1, "one watch stream open on the server")
            fake.drop_watches()
            # Written while no watch is open (no await between the drop and these writes).
            fake.store.create("", "pods", NS, pod("new"))
            fake.store.delete("", "pods", NS, "doomed", grace_seconds=0)
            await eventually(lambda: informer.get("new") is not None, "pod new in the cache")
            await cache_equals_a_fresh_list(api, informer)
            assert ("ADDED", "new", None) in events and ("DELETED", "doomed") in [
                e[:2] for e in events
            ]
            assert informer.lists == 1 and informer.watches == 2  # resumed, not relisted


async def test_an_expired_resource_version_relists_and_reports_the_difference(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path) as (fake, api):
        for name in ("kept", "changed", "doomed"):
            await api.create(PODS, NS, pod(name))
        events: list[Event] = []
        async with running(api, recorder(events)) as informer:
            await eventually(lambda: fake.stats.watches == 1, "one watch stream open on the server")
            events.clear()
            before, doomed = informer.get("changed"), informer.get("doomed")
            assert before is not None and doomed is not None
            fake.expire_next_watch()
            fake.drop_watches()
            fake.store.create("", "pods", NS, pod("new"))
            fake.store.delete("", "pods", NS, "doomed", grace_seconds=0)
            patch = {"metadata": {"labels": {"x": "1"}}}
            fake.store.patch("", "pods", NS, "changed", patch, "application/merge-patch+json")
            await eventually(lambda: informer.relists == 1, "one relist")
            await cache_equals_a_fresh_list(api, informer)
            assert sorted(events) == sorted(
                [
                    ("DELETED", "doomed", doomed["metadata"]["resourceVersion"]),
                    ("ADDED", "new", None),
                    ("MODIFIED", "changed", before["metadata"]["resourceVersion"]),
                ]
            )
            assert informer.lists == 2


async def test_server_errors_back_off_then_recover(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        await api.create(PODS, NS, pod("a"))
        fake.fail_next("list", "pods", 500, 2)
        loop = asyncio.get_running_loop()
        async with contextlib.aclosing(Informer(api, PODS, NS, backoff=(0.1, 1.0))) as informer:
            started = loop.time()
            await informer.start()
            assert loop.time() - started >= 0.1 + 0.2  # two pauses, doubling
            assert fake.stats.requests[("list", "pods")] == 3 and informer.lists == 1
            assert informer.get("a") is not None

            # A failing relist after a 410 is retried the same way.
            fake.fail_next("list", "pods", 503, 1)
            fake.expire_next_watch()
            fake.drop_watches()
            await eventually(lambda: informer.relists == 1, "one relist")
            assert fake.stats.requests[("list", "pods")] == 5


async def test_a_non_transient_error_fails_the_start_and_a_later_get_retries(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path) as (fake, api), contextlib.aclosing(Informers()) as informers:
        fake.fail_next("list", "pods", 403)
        with pytest.raises(errors.ClusterForbidden):
            await informers.get(api, PODS, NS)
        assert (await informers.get(api, PODS, NS)).lists == 1


async def test_a_watch_that_times_out_resumes_from_the_last_version(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api), running(api, timeout_seconds=1) as informer:
        await eventually(lambda: informer.watches >= 2, "a second watch")
        await api.create(PODS, NS, pod("a"))
        await eventually(
            lambda: informer.watches >= 3 and informer.get("a") is not None,
            "a third watch with pod a cached",
        )
        assert informer.lists == 1 and fake.stats.requests[("list", "pods")] == 1
        assert fake.stats.peak_watches == 1


async def test_bookmarks_advance_the_resource_version(tmp_path: Path) -> None:
    events: list[Event] = []
    async with (
        connected(tmp_path) as (_, api),
        running(api, recorder(events), label_selector="app=kernel") as informer,
    ):
        listed = int(informer.resource_version)
        other = await api.create(PODS, NS, pod("unrelated"))  # not selected: no event
        target = int(other["metadata"]["resourceVersion"])
        assert target > listed
        await eventually(
            lambda: int(informer.resource_version) >= target,
            "the cache at the target resourceVersion",
            within=5,
        )
        assert events == [] and informer.lists == 1


async def test_aclose_leaves_no_watch_open_on_the_server(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        informer = Informer(api, PODS, NS)
        await informer.start()
        await eventually(lambda: fake.stats.watches == 1, "one watch stream open on the server")
        task = informer._task
        await informer.aclose()
        assert task is not None and task.done()  # nothing of it runs any more
        await eventually(
            lambda: fake.stats.watches == 0, "no watch stream open on the server", within=5
        )


async def test_an_outage_is_one_warning_and_its_end_one_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from kernel_queue.kube.client import retries

    async with connected(tmp_path) as (fake, api):
        api.retry = retries.NEVER  # each failed request reaches the informer
        async with running(api, backoff=(0.01, 0.02)) as informer:
            with caplog.at_level(logging.DEBUG, logger="kernel_queue.kube.client.informer"):
                fake.fail_next("watch", "pods", 500, 5)
                fake.drop_watches()
                await eventually(lambda: fake.faults_pending == 0, "the injected faults spent")
                await api.create(PODS, NS, pod("after"))
                await eventually(
                    lambda: informer.get("after") is not None, "pod after in the cache"
                )
            warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warned) == 1, [r.getMessage() for r in warned]
            assert any("answers again" in r.getMessage() for r in caplog.records)
