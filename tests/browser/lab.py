"""JupyterLab as the browser tests drive it: a real `jupyter kernel-queue lab` (the local
backend, one pretend GPU, token auth, private Jupyter dirs) whose notebooks and kernelspecs the
tests write (`write_notebook`, `write_kernelspec`), Debian's Chromium driven by Playwright
(`require_browser`), and `Lab`, what a user sees and clicks there. The fixtures that start them
are in conftest.py."""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.backends.local import gpus as gpu_detection
from tests.polling import until_sync

CHROMIUM = os.environ.get("KQ_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"
TOKEN = "kernel-queue-browser-test"
# Kernels start in seconds here; the bound only stops a broken build from hanging CI.
KERNEL_WAIT_MS = 90_000
UI_WAIT_MS = 30_000
# JupyterLab marks the notebook tab on show as the current one.
CURRENT_TAB = re.compile(r"\blm-mod-current\b")
# The states of a kernel that runs (after a resume too).
RUNS = re.compile(r"^(running|resumed)$")

LAB_ENV: dict[str, dict[str, str]] = {}
"""Each running lab's environment by its base URL (a batch run beside it uses the same)."""


def require_browser() -> Any:
    """Playwright's sync API and Debian's Chromium; CI (`KQ_CI=1`, set by .ci/run) fails without."""
    missing = None
    try:
        from playwright import sync_api
    except ImportError:
        missing = "the playwright package is not installed"
    if missing is None and not Path(CHROMIUM).exists():
        missing = f"{CHROMIUM} is missing (apt-get install chromium)"
    if missing is not None:
        if os.environ.get("KQ_CI") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    return sync_api


def api(base: str, path: str, method: str = "GET", body: Any = None) -> Any:
    """The server's JSON answer to `method` `path` (under `base`) with `body` as JSON, sent with
    the lab's token."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", f"token {TOKEN}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def write_notebook(path: Path, kernel: str, source: str = "1 + 1", *more: str) -> None:
    """A notebook whose metadata names a kernelspec, so opening it starts that kernel; one code
    cell per source."""
    cells = [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": f"c{number}",
            "metadata": {},
            "outputs": [],
            "source": text,
        }
        for number, text in enumerate((source, *more), start=1)
    ]
    spec = {"name": kernel, "display_name": kernel, "language": "python"}
    notebook = {
        "cells": cells,
        "metadata": {"kernelspec": spec},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook))


def write_kernelspec(data: Path, name: str, **config: Any) -> None:
    """A queued local kernelspec in the server's private data dir."""
    folder = data / "kernels" / name
    folder.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({name})",
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "kernel_provisioner": {
                "provisioner_name": "kernel-queue",
                "config": {"backend": "local", "queue": "gpu", "gpus": 1, **config},
            }
        },
    }
    (folder / "kernel.json").write_text(json.dumps(spec))


def lay_out(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """What the lab holds: its notebooks in `tmp_path`/notebooks (its root), the queued
    kernelspecs they name in `tmp_path`/data (its Jupyter data dir), its JupyterLab settings;
    the root, and the environment to run the lab in (private Jupyter dirs under `tmp_path`)."""
    root = tmp_path / "notebooks"
    root.mkdir()
    for name in ("first", "second", "third"):
        write_notebook(root / f"{name}.ipynb", "python3-gpu-queued")
    data = tmp_path / "data"
    # Preemption: a low-priority kernel that checkpoints, and a high-priority one.
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints"), "grace_seconds": 60}
    write_kernelspec(data, "low", priority_class="low", checkpoint=checkpoint)
    write_kernelspec(data, "high", priority_class="high")
    write_notebook(root / "low.ipynb", "low", source="x = 41")
    write_notebook(root / "high.ipynb", "high")
    # Failure: a kernel that gives up after 1 s in the queue (the GPU stays busy meanwhile).
    write_kernelspec(data, "impatient", priority_class="low", admission_timeout=1)
    write_notebook(root / "impatient.ipynb", "impatient")
    # Parking: a kernel that checkpoints; parked from the panel (park_after stays off).
    write_kernelspec(data, "parks", checkpoint=checkpoint)
    write_notebook(root / "parks.ipynb", "parks", "x = 41", "print('back', x + 1)")
    # Idle parking with the notebook open: JupyterLab's own traffic does not keep it awake.
    write_kernelspec(data, "idles", checkpoint=checkpoint, park_after=3)
    write_notebook(root / "idles.ipynb", "idles", "y = 6 * 7", "print('awake', y)")
    # Kernels that can never start: more GPUs than the machine has, and a queue that is not.
    write_kernelspec(data, "toobig", gpus=3)
    write_notebook(root / "toobig.ipynb", "toobig")
    write_kernelspec(data, "nosuch", queue="nosuch")
    write_notebook(root / "nosuch.ipynb", "nosuch")
    settings = tmp_path / "lab-settings"
    # Every admission after a wait notifies (the default waits 10 s): the test needs no sleep.
    (settings / "kernel-queue").mkdir(parents=True)
    (settings / "kernel-queue" / "store.jupyterlab-settings").write_text(
        json.dumps({"longWaitSeconds": 0})
    )
    # No news or update toasts (and no attempt to reach the network for them).
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    ).write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CUDA_"))}
    env.update(
        HOME=str(tmp_path / "home"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_DATA_DIR=str(data),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
    )
    if gpu_detection.detect():
        env["CUDA_VISIBLE_DEVICES"] = "0"  # a real GPU machine: queue on one of them
    return root, env


class Lab:
    """What the tests do in JupyterLab, by what a user sees and clicks."""

    def __init__(self, page: Any, expect: Any, base: str, artifacts: Path) -> None:
        self.page, self.expect, self.base, self.artifacts = page, expect, base, artifacts
        self.status = page.locator(".jp-KernelQueue-status")
        self._step = 0

    def shot(self, name: str) -> None:
        self._step += 1
        self.page.screenshot(path=str(self.artifacts / f"{self._step:02d}-{name}.png"))

    def tab(self, name: str) -> Any:
        return self.page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name)

    def open_notebook(self, name: str) -> None:
        """Double-click it in the file browser (opens it, or shows it if already open)."""
        self.page.locator(".jp-DirListing-item", has_text=name).dblclick()
        self.expect(self.tab(name)).to_have_class(CURRENT_TAB)

    def goto(self, path: str) -> None:
        self.page.goto(f"{self.base}{path}?token={TOKEN}")

    def first_cell_run(self, name: str) -> str | None:
        """Go to notebook `name`, wait until its kernel runs and run its first cell to its end
        (its prompt reads [1]): the kernel's id."""
        self.goto(f"lab/tree/{name}")
        self.runs()
        kernel = self.status.get_attribute("data-kernel-id")
        self.page.locator(".jp-NotebookPanel:visible .jp-Cell").first.click()
        self.page.keyboard.press("Shift+Enter")
        prompt = self.page.locator(".jp-InputArea-prompt", has_text="[1]").first
        self.expect(prompt).to_be_visible()
        return kernel

    def shut_down_kernel(self) -> None:
        """Kernel ▸ Shut Down Kernel, for the current notebook."""
        self.page.locator(".lm-MenuBar-item", has_text="Kernel").click()
        self.page.locator(".lm-Menu-item", has_text="Shut Down Kernel").first.click()

    def runs(self, within: float = KERNEL_WAIT_MS) -> None:
        """The current notebook's kernel runs: JupyterLab's own status says so ("| Idle"), the
        toolbar's indicator is gone and our item says nothing of it (hidden, or only
        "Queue · N waiting" while others wait)."""
        self.expect(self.status).to_have_attribute("data-state", RUNS, timeout=within)
        self.expect(self.indicator).to_be_hidden()
        self.expect(self.status).not_to_have_text(re.compile("Running|Queued|Admitted"))
        statusbar = self.page.locator("#jp-main-statusbar")
        self.expect(statusbar).to_contain_text("| Idle", timeout=within)

    @property
    def indicator(self) -> Any:
        """The current notebook's toolbar indicator."""
        return self.page.locator(".jp-NotebookPanel:visible .jp-KernelQueue-indicator")

    def open_queues(self) -> Any:
        """The command palette's "Kernel Queue: Show queues"; returns the dialog."""
        self.page.keyboard.press("Control+Shift+C")
        search = self.page.locator(".lm-CommandPalette-input")
        self.expect(search).to_be_focused()
        search.fill("Kernel Queue: Show queues")
        self.page.locator(".lm-CommandPalette-item", has_text="Kernel Queue: Show queues").click()
        dialog = self.page.locator(".jp-Dialog", has_text="Kernel queues")
        self.expect(dialog).to_be_visible()
        return dialog

    def queue_row(self, kernel_id: str) -> Any:
        return self.page.locator(f'.jp-KernelQueue-queueRow[data-kernel-id="{kernel_id}"]')

    def toast(self, text: str) -> Any:
        return self.page.locator(".Toastify__toast", has_text=text)

    def kernels(self) -> dict[str, Any]:
        """The server's own listing, as the extension loads it."""
        return {k["id"]: k for k in api(self.base, "api/kernel-queue/kernels")}

    def gone(self, kernel_id: str, within: float = 30) -> dict[str, Any]:
        """The listing once `kernel_id` has left it (a shutdown ends after DELETE returns)."""

        def without_it() -> dict[str, Any] | None:
            listing = self.kernels()
            return None if kernel_id in listing else listing

        return until_sync(without_it, f"kernel {kernel_id} gone from the listing", within=within)
