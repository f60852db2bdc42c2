"""The kernel's hold on execute requests until IOPub subscriptions settle (launcher side)."""

from __future__ import annotations

import asyncio
import time

from kernel_queue.launcher.subscriptions import Subscriptions


async def test_a_request_runs_only_once_subscriptions_were_quiet_for_the_settle_time() -> None:
    subscriptions = Subscriptions(settle=0.2, first_wait=5)
    subscriptions.seen()
    late: list[float] = []

    async def another_client_comes_back() -> None:
        await asyncio.sleep(0.1)
        late.append(time.monotonic())
        subscriptions.seen()

    waiter = asyncio.create_task(subscriptions.settled())
    await another_client_comes_back()
    await waiter
    assert time.monotonic() - late[0] >= 0.2  # quiet for the settle time after the last one


async def test_a_kernel_without_any_subscriber_holds_only_its_first_request() -> None:
    subscriptions = Subscriptions(settle=0.2, first_wait=0.3)
    started = time.monotonic()
    await subscriptions.settled()
    assert time.monotonic() - started >= 0.3
    subscriptions.first_wait = 60  # a second wait for a first subscriber would now show
    async with asyncio.timeout(10):
        await subscriptions.settled()


async def test_an_ipykernel_that_reports_no_subscriptions_holds_nothing() -> None:
    subscriptions = Subscriptions(settle=10, first_wait=10)
    subscriptions.unknowable()
    async with asyncio.timeout(5):
        await subscriptions.settled()


def test_only_a_sessions_first_message_opens_it() -> None:
    subscriptions = Subscriptions()
    subscriptions.message("lab", "info-1")  # JupyterLab says kernel_info first
    subscriptions.message("lab", "execute-1")
    subscriptions.message("console", "execute-2")  # a client back from the replaced kernel
    assert not subscriptions.opens_session("lab", "execute-1")
    assert subscriptions.opens_session("console", "execute-2")
    assert not subscriptions.opens_session("", "")


async def test_a_late_subscriber_ends_the_wait_for_it_and_none_ends_it_after_the_bound() -> None:
    subscriptions = Subscriptions()
    asked = time.monotonic()

    async def blocking_client_polls_its_iopub() -> None:
        await asyncio.sleep(0.05)
        subscriptions.seen()

    async with asyncio.timeout(5):
        await asyncio.gather(
            subscriptions.late(asked, within=30), blocking_client_polls_its_iopub()
        )
    assert subscriptions.since(asked)
    started = time.monotonic()
    await subscriptions.late(time.monotonic(), within=0.2)
    assert time.monotonic() - started >= 0.2


def test_a_subscription_between_a_requests_busy_and_its_handler_missed_the_busy() -> None:
    """A CI run lost a first cell's busy status this way (1 of 20 returns): the blocking client
    subscribed after ipykernel said `busy` and before the request's handler ran, which then
    took its own start as the request's and did not say `busy` again."""
    subscriptions = Subscriptions()
    subscriptions.busy("execute-1")  # said to no one: the client has not subscribed again yet
    time.sleep(0.01)
    subscriptions.seen()  # it subscribes...
    time.sleep(0.01)
    asked = subscriptions.asked("execute-1")  # ...before the handler runs
    assert subscriptions.since(asked)  # so the handler says `busy` again
    before = time.monotonic()
    assert subscriptions.asked("execute-2") >= before  # no busy said for it: now
    assert subscriptions.asked("") >= before
