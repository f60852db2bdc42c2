"""The wait estimate from literal admission times: rate, estimate per position, wording."""

from __future__ import annotations

import pytest

from kernel_queue import wait_estimate
from kernel_queue.wait_estimate import Admissions, describe, estimate, rate, rounded, words

NOW = 10_000.0


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        pytest.param([], None, id="none"),
        pytest.param([NOW - 120, NOW - 60], None, id="two-are-too-few"),
        pytest.param([NOW - 120, NOW - 60, NOW], 2 / 120, id="three-a-minute-apart"),
        pytest.param([NOW - 240, NOW - 180, NOW - 120], 2 / 240, id="slows-while-none-comes"),
        pytest.param([NOW - 2, NOW - 1, NOW], 2 / 60, id="a-burst-counts-over-a-minute"),
        pytest.param(
            [NOW - 3600, NOW - 3000, NOW - 120, NOW - 60], None, id="older-than-the-window"
        ),
        pytest.param(
            [NOW - 2000, NOW - 1700, NOW - 1500, NOW - 60], 2 / 1700, id="window-is-30-minutes"
        ),
        pytest.param([NOW - 60 * i for i in range(30)], 19 / (19 * 60), id="the-20-newest"),
        pytest.param([NOW - 120, NOW - 60, NOW + 3], 2 / 120, id="a-clock-ahead-counts-as-now"),
    ],
)
def test_rate(times: list[float], expected: float | None) -> None:
    assert rate(times, now=NOW) == expected


@pytest.mark.parametrize(
    ("position", "expected"),
    [
        pytest.param(1, 60.0, id="next"),
        pytest.param(4, 240.0, id="fourth"),
        pytest.param(3, 180.0, id="third"),
        pytest.param(0, None, id="position-unknown"),
    ],
)
def test_estimate_for_a_position(position: int, expected: float | None) -> None:
    times = [NOW - 180, NOW - 120, NOW - 60]  # one a minute: 2 in the 120 s since the oldest
    assert estimate(times, now=NOW - 60, position=position) == expected


def test_too_few_admissions_give_no_estimate() -> None:
    assert estimate([NOW - 60, NOW], now=NOW, position=1) is None
    assert describe(None) == ""


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0.3, "about 10 s"),
        (10.0, "about 10 s"),
        (31.0, "about 40 s"),
        (50.0, "about 50 s"),
        (51.0, "about 1 min"),
        (89.0, "about 1 min"),
        (91.0, "about 2 min"),
        (240.0, "about 4 min"),
        (3569.0, "about 59 min"),
        (3571.0, "about 1 h"),
        (7000.0, "about 2 h"),
        (23 * 3600.0, "about 23 h"),
        (23.6 * 3600, "more than a day"),
        (5 * 86400.0, "more than a day"),
    ],
)
def test_words(seconds: float, expected: str) -> None:
    assert words(seconds) == expected
    assert words(rounded(seconds)) == expected  # the estimate's seconds say the same words


def test_an_estimate_is_rounded_to_its_words_so_it_changes_only_with_them() -> None:
    times = [NOW - 300, NOW - 200, NOW - 100]
    first = estimate(times, now=NOW - 100, position=2)
    later = estimate(times, now=NOW - 99, position=2)
    assert first == later == 180.0  # 200 s and 201 s: "about 3 min" both


def test_describe_says_it_is_an_estimate() -> None:
    assert describe(240.0) == "about 4 min at the recent rate"


def test_admissions_count_each_once_keep_the_newest_and_sort_a_relist() -> None:
    seen = Admissions()
    for at in (300.0, 100.0, 200.0, 100.0):
        seen.observe("user-queue", ("kq-a", at), at)
    seen.observe("user-queue", ("kq-a", 300.0), 300.0)  # a later change of the same Workload
    assert seen.times("user-queue") == [100.0, 200.0, 300.0]
    for at in range(1000, 1000 + wait_estimate.KEPT):
        seen.observe("user-queue", at, float(at))
    assert len(seen.times("user-queue")) == wait_estimate.KEPT
    assert seen.times("user-queue")[0] == 1000.0
    assert seen.times("other-queue") == []
    assert seen.estimate("user-queue", now=1000.0 + wait_estimate.KEPT, position=1) is not None
