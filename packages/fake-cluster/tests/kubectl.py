"""Real kubectl against a started fake cluster, for the tests that hold the fake to what kubectl
users see. kubectl must be installed: a test that needs it fails saying so, never skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from kernel_queue_fake_cluster.cluster import FakeCluster

T = TypeVar("T")
TIMEOUT = 60.0
"""Seconds one kubectl command may take before the test fails (a hang is a failure)."""


class Kubectl:
    """Runs `kubectl` with a cluster's kubeconfig and a HOME of its own (no cache, no config
    of the user's)."""

    def __init__(self, cluster: FakeCluster, home: Path) -> None:
        path = shutil.which("kubectl")
        if path is None:
            pytest.fail("kubectl is not installed: these tests run the real kubectl; install it")
        self.path, self.home, self.kubeconfig = path, home, cluster.kubeconfig
        home.mkdir(parents=True, exist_ok=True)

    def run(self, *args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """The finished command (not checked)."""
        env = {**os.environ, "HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig)}
        return subprocess.run(
            [self.path, *map(str, args)],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def watch(self, *args: str | Path) -> subprocess.Popen[str]:
        """A command left running (`kubectl get -w`), its stdout a pipe; the caller kills it."""
        env = {**os.environ, "HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig)}
        command = [self.path, *map(str, args)]
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)

    def __call__(self, *args: str | Path, stdin: str | None = None) -> str:
        """The command's output; the test fails with its stderr when it exits non-zero."""
        done = self.run(*args, stdin=stdin)
        if done.returncode != 0:
            pytest.fail(f"kubectl {' '.join(map(str, args))} failed: {done.stderr.strip()}")
        return done.stdout

    def fails(self, *args: str | Path, stdin: str | None = None) -> str:
        """The stderr of a command that must fail; the test fails when it succeeds."""
        done = self.run(*args, stdin=stdin)
        if done.returncode == 0:
            pytest.fail(f"kubectl {' '.join(map(str, args))} succeeded: {done.stdout.strip()}")
        return done.stderr


def until(check: Callable[[], T], what: str, *, within: float = 60.0) -> T:
    """Poll `check` until it returns something true; fail naming `what` when it never does."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what}; last: {result!r}")
        time.sleep(0.05)
