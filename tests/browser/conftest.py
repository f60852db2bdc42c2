"""The browser tests' fixtures: a real `jupyter kernel-queue lab` laid out by `lab.lay_out`
(`lab`, its base URL), a page of Debian's headless Chromium (`page`), the test's screenshot folder
(`artifacts`) and `ui`, the page as `lab.Lab` drives it."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.lab import (
    ARTIFACTS,
    CHROMIUM,
    LAB_ENV,
    TOKEN,
    UI_WAIT_MS,
    Lab,
    api,
    lay_out,
    require_browser,
)
from tests.cli_support import lab_command
from tests.polling import until_sync
from tests.ports import free_port as _free_port


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """This test's screenshot folder under test-artifacts/browser/, emptied first."""
    name, _, param = request.node.name.removeprefix("test_").partition("[")
    param = param.rstrip("]")  # each parameter its own folder, however long the test's name
    folder = ARTIFACTS / (f"{name[: 59 - len(param)]}-{param}" if param else name[:60])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def browser_api() -> Any:
    return require_browser()


@pytest.fixture
def lab(tmp_path: Path, artifacts: Path, browser_api: Any) -> Iterator[str]:
    """`jupyter kernel-queue lab` with 1 pretend GPU, private dirs; yields its base URL."""
    root, env = lay_out(tmp_path)
    port = _free_port()
    log_path = tmp_path / "lab.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        lab_command(port, TOKEN, "--ip=127.0.0.1", f"--ServerApp.root_dir={root}"),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/"
    LAB_ENV[base] = env
    try:

        def answering() -> bool:
            assert process.poll() is None, log_path.read_text()
            try:
                api(base, "api/status")
            except OSError:
                return False
            return True

        until_sync(answering, f"the lab at {base} answering", within=60)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        stuck = False
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stuck = True
            process.kill()
            process.wait()
        log.close()
        shutil.copy(log_path, artifacts / "lab.log")
    if stuck:  # a user's Ctrl-C would hang the same way
        last = log_path.read_text().strip().splitlines()[-1:]
        pytest.fail(f"the lab did not stop within 60 s of SIGTERM; its log ends: {last}")


@pytest.fixture
def page(browser_api: Any, lab: str, artifacts: Path) -> Iterator[Any]:
    """A page of headless Debian Chromium; its last state is screenshotted whatever happens."""
    browser_api.expect.set_options(timeout=UI_WAIT_MS)
    with browser_api.sync_playwright() as playwright:
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
            yield page
        finally:
            page.screenshot(path=str(artifacts / "99-last.png"))
            browser.close()


@pytest.fixture
def ui(page: Any, browser_api: Any, lab: str, artifacts: Path) -> Lab:
    """The test's page on the lab, as a user sees and clicks it."""
    return Lab(page, browser_api.expect, lab, artifacts)
