"""JupyterLab in headless Chromium shows the queue: two notebooks share one GPU, the second
waits and says so, runs when the first is shut down (with a notification), and a queued kernel
is cancelled from the panel.

A real `jupyter kernel-queue lab` (local backend, 1 pretend GPU, token auth, private Jupyter
dirs) and Debian's Chromium driven by Playwright; never a downloaded browser. Screenshots of
each step go to `test-artifacts/browser/`; assertions read the DOM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.backends import gpus as gpu_detection

CHROMIUM = os.environ.get("KQ_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"
JUPYTER = str(Path(sys.executable).parent / "jupyter")
TOKEN = "kernel-queue-browser-test"
# Kernels start in seconds here; the bound only stops a broken build from hanging CI.
KERNEL_WAIT_MS = 90_000
UI_WAIT_MS = 30_000

pytestmark = pytest.mark.timeout(300)


def _require_browser() -> Any:
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api(base: str, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(base + path, method=method)
    request.add_header("Authorization", f"token {TOKEN}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def _notebook(path: Path) -> None:
    """A notebook whose metadata names the queued GPU kernelspec, so opening it starts one."""
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": "code",
                        "execution_count": None,
                        "id": "c1",
                        "metadata": {},
                        "outputs": [],
                        "source": "1 + 1",
                    }
                ],
                "metadata": {
                    "kernelspec": {
                        "name": "python3-gpu-queued",
                        "display_name": "Python 3 (1 GPU, queued)",
                        "language": "python",
                    }
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    """`jupyter kernel-queue lab` with 1 pretend GPU, private dirs; yields its base URL."""
    root = tmp_path / "notebooks"
    root.mkdir()
    for name in ("first", "second", "third"):
        _notebook(root / f"{name}.ipynb")
    settings = tmp_path / "lab-settings"
    # Every admission after a wait notifies (the default waits 10 s): the test needs no sleep.
    (settings / "kernel-queue").mkdir(parents=True)
    (settings / "kernel-queue" / "plugin.jupyterlab-settings").write_text(
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
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
    )
    if gpu_detection.detect():
        env["CUDA_VISIBLE_DEVICES"] = "0"  # a real GPU machine: queue on one of them
    port = _free_port()
    log = (tmp_path / "lab.log").open("w")
    process = subprocess.Popen(
        [
            JUPYTER,
            "kernel-queue",
            "lab",
            "--pretend-gpus",
            "1",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={root}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(1200):
            try:
                _api(base, "api/status")
                break
            except OSError:
                assert process.poll() is None, (tmp_path / "lab.log").read_text()
                time.sleep(0.05)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "lab.log", ARTIFACTS / "lab.log")


def test_the_second_notebook_waits_runs_when_the_first_stops_and_cancel_leaves_the_queue(
    lab: str, tmp_path: Path
) -> None:
    sync_api = _require_browser()
    expect = sync_api.expect
    expect.set_options(timeout=UI_WAIT_MS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],  # launch() gives Chromium a fresh temporary profile (--user-data-dir) itself
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            _scenario(page, expect, lab)
        finally:
            page.screenshot(path=str(ARTIFACTS / "99-last.png"))
            browser.close()


def _scenario(page: Any, expect: Any, base: str) -> None:
    status = page.locator(".jp-KernelQueue-status")
    step = iter(range(1, 100))

    def shot(name: str) -> None:
        page.screenshot(path=str(ARTIFACTS / f"{next(step):02d}-{name}.png"))

    def tab(name: str) -> Any:
        return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name)

    def open_notebook(name: str) -> None:
        page.locator(".jp-DirListing-item", has_text=name).dblclick()
        expect(tab(name)).to_have_class(_current_tab())

    def kernels() -> dict[str, Any]:
        return {k["id"]: k for k in _api(base, "api/kernel-queue/kernels")}

    page.goto(f"{base}lab/tree/first.ipynb?token={TOKEN}")
    expect(tab("first.ipynb")).to_have_class(_current_tab())
    expect(status).to_have_text("Running", timeout=KERNEL_WAIT_MS)
    first_kernel = status.get_attribute("data-kernel-id")
    shot("first-running")

    # The second notebook's kernel waits for the only GPU, and says where.
    open_notebook("second.ipynb")
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    second_kernel = status.get_attribute("data-kernel-id")
    assert second_kernel and second_kernel != first_kernel
    shot("second-queued")

    # Each notebook shows its own kernel: the first still reads Running.
    tab("first.ipynb").click()
    expect(status).to_have_text("Running")
    expect(status).to_have_attribute("data-kernel-id", first_kernel)
    tab("second.ipynb").click()
    expect(status).to_have_text("Queued · #1 in gpu")

    # A reload rebuilds the view from the server's listing (no event arrives meanwhile).
    page.reload()
    expect(tab("second.ipynb")).to_have_class(_current_tab())
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    shot("second-queued-after-reload")

    # Shut the first kernel down from its notebook; the second is admitted and runs.
    open_notebook("first.ipynb")  # the reload opened only the second
    expect(status).to_have_text("Running")
    expect(status).to_have_attribute("data-kernel-id", first_kernel)
    page.locator(".lm-MenuBar-item", has_text="Kernel").click()
    page.locator(".lm-Menu-item", has_text="Shut Down Kernel").first.click()
    open_notebook("second.ipynb")
    expect(status).to_have_text("Running", timeout=KERNEL_WAIT_MS)
    toast = page.locator(".Toastify__toast", has_text="second.ipynb: kernel admitted with 1 GPU")
    expect(toast).to_be_visible()
    assert first_kernel not in kernels()
    shot("second-admitted")

    # A third notebook queues behind the second; the panel lists it and cancels it.
    open_notebook("third.ipynb")
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    third_kernel = status.get_attribute("data-kernel-id")
    assert third_kernel in kernels()
    status.click()
    row = page.locator(f'.jp-KernelQueue-row[data-kernel-id="{third_kernel}"]')
    expect(row).to_be_visible()
    cells = row.locator("td")
    expect(cells.nth(0)).to_have_text("third.ipynb")
    expect(cells.nth(1)).to_have_text("gpu")
    expect(cells.nth(2)).to_have_text("#1 of 1")
    expect(cells.nth(4)).to_have_text("1 GPU")
    expect(page.locator(".jp-KernelQueue-row")).to_have_count(1)  # the running one is not queued
    shot("panel-lists-third")
    row.locator(".jp-KernelQueue-cancel").click()
    expect(row).to_have_count(0)
    # Nothing waits any more and the third notebook has no kernel: the item goes away.
    expect(status).to_be_hidden()
    expect(page.locator(".jp-NotebookPanel:visible .jp-KernelName")).to_have_text("No Kernel")
    shot("third-cancelled")
    remaining = kernels()
    assert third_kernel not in remaining
    assert remaining[second_kernel]["queue"]["state"] == "running"


def _current_tab() -> Any:
    import re

    return re.compile(r"\blm-mod-current\b")
