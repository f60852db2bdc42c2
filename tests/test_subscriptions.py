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
