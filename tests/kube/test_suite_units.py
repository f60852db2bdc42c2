"""How the suite deals the real plane's tests to its workers (`tests/workers.py`): Kueue 0.14's
tests stay one unit (its visibility server's fixed port), a later release's modules are dealt to
`SHARES` units of about the same size, each test of a module in the same unit; a module whose
tests share a set-up is one unit."""

from __future__ import annotations

import os
import sys

import pytest

from tests.commands import ran
from tests.conftest import REPO
from tests.workers import SHARED_SET_UP, SHARES, on_real_plane, real_plane_unit, shares, unit

IDS = [
    *(f"tests/kube/test_a.py::t{i}[real-0.19-x]" for i in range(5)),
    *(f"tests/kube/test_b.py::t{i}[real-0.19]" for i in range(3)),
    *(f"tests/kube/test_c.py::t{i}[real-0.19]" for i in range(2)),
    "tests/kube/test_a.py::t9[fake-0.19]",
    *(f"tests/kube/test_d.py::t{i}[real-0.14]" for i in range(4)),
    "tests/recipes/test_recipes_real_plane.py::t0",
    "tests/core/test_e.py::t0",
]


def test_a_release_without_fixed_ports_is_dealt_by_module_to_units_of_about_one_size() -> None:
    assert SHARES == 2
    found = shares(IDS)
    a, b, c = (f"tests/kube/test_{m}.py" for m in "abc")
    unit_of = {
        module: {u for i, u in found.items() if i.startswith(module)} for module in (a, b, c)
    }
    assert unit_of == {
        a: {"real-control-plane-0.19-1"},
        b: {"real-control-plane-0.19-2"},
        c: {"real-control-plane-0.19-2"},
    }
    # 0.14's tests, a *_real_plane.py module and the tests on no real plane are not dealt
    assert set(found) == {i for i in IDS if i.startswith((a, b, c)) and "real-" in i}
    assert real_plane_unit("tests/kube/test_d.py::t0[real-0.14]") == "real-control-plane-0.14"


def test_three_units_take_the_three_modules_one_each() -> None:
    found = shares(IDS, count=3)
    assert sorted(set(found.values())) == [f"real-control-plane-0.19-{i}" for i in (1, 2, 3)]


def test_a_module_with_a_shared_set_up_is_one_unit_and_other_tests_their_own() -> None:
    corpus = "tests/checkpoint/test_restore_corpus.py"
    assert corpus in SHARED_SET_UP
    found = shares(IDS)
    assert {unit(f"{corpus}::t[{case}]", found) for case in ("a", "b")} == {corpus}
    assert unit("tests/core/test_e.py::t0", found) == "tests/core/test_e.py::t0"
    assert unit("tests/kube/test_a.py::t0[real-0.19-x]", found) == "real-control-plane-0.19-1"
    assert unit("tests/recipes/test_recipes_real_plane.py::t0", found) == (
        "real-control-plane-tests/recipes/test_recipes_real_plane.py"
    )


@pytest.mark.parametrize("selected", ["real_plane", "not real_plane"])
def test_the_real_plane_mark_selects_exactly_the_tests_on_the_real_plane(selected: str) -> None:
    """`-m "not real_plane"` is how the README leaves the real plane out (`-k "not real"`
    also left out seven fake-cluster tests with "real" in their names)."""
    module = "tests/kube/test_kube_waiting.py"  # tests on both planes
    collect = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]
    done = ran(
        [*collect, "-m", selected, module],
        env=os.environ,
        cwd=REPO,
    )
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert done.returncode == 0 and ids, done.stdout + done.stderr
    assert all(on_real_plane(i) == (selected == "real_plane") for i in ids), ids
