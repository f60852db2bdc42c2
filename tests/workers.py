"""How the suite shares its workers (pytest-xdist, `scripts/test`), and where their time went.

Each test is its own unit of work, except those on the real control plane: a worker runs those
of one unit one after another on one plane it starts once (`tests.kube.planes.RealPlanes`). Kueue
0.14's visibility server listens on a fixed port, so every test on 0.14 is one unit; a later
release takes free ports, so its tests are split by module into `SHARES` units of about the same
number of tests, which run at once on planes of their own (one unit held them all, 125 tests on
one worker: the suite's longest line). A `*_real_plane.py` module runs on the newest release and
is a unit of its own, and so is a module whose tests share a module-scoped fixture
(`SHARED_SET_UP`). The scheduler hands out the largest unit first, so these long units start
at once.

At the end of a parallel run the controller prints, for each worker, how many tests it ran,
how long they took (on the real plane too) and when its last one ended: the line to read when
the suite's time is the question.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

REAL_PLANE_UNIT = "real-control-plane"
_RELEASE = re.compile(r"(?:^|-)real-(\d+\.\d+)")
FIXED_PORTS = ("0.14",)
"""Releases of which two planes cannot run at once on one machine (a fixed port)."""
SHARES = 2
"""Units the tests of any other release are split into, each on a plane of its own."""
SHARED_SET_UP = (
    "tests/checkpoint/test_restore_corpus.py",
    "tests/recipes/test_base.py",
    "tests/recipes/test_enterprise_gateway_recipe.py",
    "tests/recipes/test_jupyterhub.py",
    "tests/recipes/test_kubeflow.py",
    "packages/fake-cluster/tests/test_conversion.py",
    "packages/fake-cluster/tests/test_kubectl_surfaces.py",
    "packages/fake-cluster/tests/test_schema.py",
)
"""Modules whose tests share a module-scoped fixture (a corpus run, a cluster with a recipe
applied): each is one unit, so its set-up runs once, not once on every worker that gets one of
its tests (the restore corpus's 14-36 s ran on two workers). `pytest_collection_modifyitems`
fails a run where a module with such a fixture is missing here."""


def on_real_plane(nodeid: str) -> bool:
    """Whether a test runs on the real control plane, by its id (what xdist's controller sees):
    its `plane` is `real-<release>`, or its module is a `*_real_plane.py`."""
    return real_plane_unit(nodeid) is not None


def real_plane_unit(nodeid: str) -> str | None:
    """The unit of work of a test on the real plane (one per release, one per `*_real_plane.py`
    module); None for a test that is not on it."""
    module, _, rest = nodeid.partition("::")
    if module.endswith("_real_plane.py"):
        return f"{REAL_PLANE_UNIT}-{module}"
    found = _RELEASE.search(rest.partition("[")[2])
    return f"{REAL_PLANE_UNIT}-{found.group(1)}" if found else None


def unit(nodeid: str, shared: dict[str, str]) -> str:
    """The unit of work of a test, given the real plane's `shares`: its real plane's (share),
    its module for a module in `SHARED_SET_UP`, else the test alone."""
    module = nodeid.partition("::")[0]
    found = shared.get(nodeid) or real_plane_unit(nodeid)
    return found or (module if module in SHARED_SET_UP else nodeid)


def shares(nodeids: Iterable[str], count: int = SHARES) -> dict[str, str]:
    """The unit of each test of a release without fixed ports: its modules dealt, the largest
    first, to whichever of `count` units of that release holds the fewest tests so far."""
    modules: Counter[tuple[str, str]] = Counter()
    for nodeid in nodeids:
        unit = real_plane_unit(nodeid)
        if unit and not unit.endswith(("_real_plane.py", *FIXED_PORTS)):
            modules[unit, nodeid.partition("::")[0]] += 1
    held: Counter[str] = Counter()
    placed: dict[tuple[str, str], str] = {}
    for (unit, module), tests in sorted(modules.items(), key=lambda item: (-item[1], item[0])):
        share = min((f"{unit}-{i + 1}" for i in range(count)), key=lambda s: (held[s], s))
        held[share] += tests
        placed[unit, module] = share
    found = {}
    for nodeid in nodeids:
        unit = real_plane_unit(nodeid)
        if unit is not None and (unit, nodeid.partition("::")[0]) in placed:
            found[nodeid] = placed[unit, nodeid.partition("::")[0]]
    return found


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class RealPlanesTogether(LoadScopeScheduling):  # type: ignore[misc]
        """Each test its own unit of work, but those on one real plane one unit (a release
        without fixed ports: `SHARES` units), and those of a module in `SHARED_SET_UP`."""

        _shares: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._shares is None:
                self._shares = shares(self.collection)
            return unit(nodeid, self._shares)

    return RealPlanesTogether(config, log)


REAL_PLANE_MARK = "real_plane"
"""The mark every test on the real control plane gets (`-m "not real_plane"` leaves them out)."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a real plane must say so in its id (`on_real_plane`), or it would run
    on any worker, beside another's plane; each such test is marked `real_plane`. A module
    whose tests share a module-scoped fixture must be in `SHARED_SET_UP`."""
    for item in items:
        if on_real_plane(item.nodeid):
            item.add_marker(REAL_PLANE_MARK)
        module = item.nodeid.partition("::")[0]
        shared = sorted(name for name, scope in _scopes(item) if scope in ("module", "package"))
        if shared and module not in SHARED_SET_UP and not on_real_plane(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid} uses the module-scoped fixture(s) {', '.join(shared)}: add "
                f"{module} to SHARED_SET_UP in tests/workers.py, so its set-up runs once"
            )
        callspec = getattr(item, "callspec", None)
        plane = callspec.params.get("plane") if callspec else None
        real = "real_planes" in getattr(item, "fixturenames", ()) or (plane and plane[0] == "real")
        if real and not on_real_plane(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid} uses the real control plane but its id does not say so: name "
                "its module *_real_plane.py or its `plane` parameter real-<release>"
            )


def _scopes(item: pytest.Item) -> list[tuple[str, str]]:
    """(name, scope) of each fixture the test uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [(name, defs[-1].scope) for name, defs in info.name2fixturedefs.items() if defs]


@dataclass
class _Worker:
    tests: int = 0
    seconds: float = 0.0
    real_plane: float = 0.0
    last: float = 0.0


class WorkerTimes:
    """Per worker: tests run, their seconds (set-up, call and teardown), those on the real
    plane, and when its last report came (seconds since the session started)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.workers: dict[str, _Worker] = defaultdict(_Worker)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        gateway = getattr(getattr(report, "node", None), "gateway", None)
        worker = self.workers[getattr(gateway, "id", "main")]
        worker.seconds += report.duration
        if on_real_plane(report.nodeid):
            worker.real_plane += report.duration
        if report.when == "teardown":
            worker.tests += 1
        worker.last = time.monotonic() - self.started

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.workers:
            return
        terminalreporter.section("time per worker")
        for name, worker in sorted(self.workers.items()):
            terminalreporter.write_line(
                f"{name}: {worker.tests} tests in {worker.seconds:.0f} s "
                f"({worker.real_plane:.0f} s on the real plane), its last ended at "
                f"{worker.last:.0f} s"
            )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{REAL_PLANE_MARK}: runs on the real control plane (given by tests/workers.py)"
    )
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        config.pluginmanager.register(WorkerTimes(), "kernel-queue-worker-times")
