"""Queued kernels hold no connection open in JupyterLab: with the only GPU taken, three notebooks
wait in the queue and a plain "Python 3 (ipykernel)" notebook opened after them still runs its
cell within seconds (a browser lets one websocket per host be CONNECTING at a time, so a
waiting kernel's held upgrade used to keep every later notebook on "Connecting").

Uses the `lab` and `page` fixtures of `test_lab_queue_ui` (a real `jupyter kernel-queue lab`
with 1 pretend GPU, Debian's Chromium); screenshots in `test-artifacts/browser/<test>/`.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from tests.browser import test_lab_queue_ui as queue_ui
from tests.browser.test_lab_queue_ui import KERNEL_WAIT_MS, TOKEN, Lab, _notebook
from tests.polling import until_sync

# The queue UI tests' fixtures, used here by name.
artifacts, browser_api, lab, page = (
    queue_ui.artifacts,
    queue_ui.browser_api,
    queue_ui.lab,
    queue_ui.page,
)

PLAIN_RUNS_MS = 30_000
"""A plain ipykernel starts in a few seconds here; a blocked websocket never connects."""
QUEUED = re.compile(r"Queued · #[123] in gpu")


def _start_kernel(base: str, name: str) -> str:
    """POST /api/kernels, as a script or another client would: the kernel's id."""
    request = urllib.request.Request(
        base + "api/kernels", data=json.dumps({"name": name}).encode(), method="POST"
    )
    request.add_header("Authorization", f"token {TOKEN}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["id"])


def test_a_plain_notebook_runs_at_once_beside_three_queued_ones(
    page: Any, browser_api: Any, lab: str, artifacts: Path, tmp_path: Path
) -> None:
    ui = Lab(page, browser_api.expect, lab, artifacts)
    expect = ui.expect
    _notebook(tmp_path / "notebooks" / "plain.ipynb", "python3", "print('plain ran')")
    holder = _start_kernel(lab, "python3-gpu-queued")  # takes the only GPU

    def holds() -> bool:
        return (ui.kernels()[holder].get("queue") or {}).get("state") == "running"

    until_sync(holds, "the REST kernel running on the only GPU", within=KERNEL_WAIT_MS / 1000)

    ui.goto("lab/tree/first.ipynb")
    expect(ui.tab("first.ipynb")).to_have_class(re.compile(r"\blm-mod-current\b"))
    expect(ui.status).to_have_text(QUEUED, timeout=KERNEL_WAIT_MS)
    for name in ("second.ipynb", "third.ipynb"):
        ui.open_notebook(name)
        expect(ui.status).to_have_text(QUEUED, timeout=KERNEL_WAIT_MS)
    waiting = [k for k in ui.kernels().values() if (k.get("queue") or {}).get("state") == "queued"]
    assert len(waiting) == 3, waiting
    ui.shot("three-queued")

    ui.open_notebook("plain.ipynb")
    # JupyterLab's own status bar: connected and idle, not "Connecting" behind the queue.
    idle = page.get_by_role("button", name="Python 3 (ipykernel) | Idle")
    expect(idle).to_be_visible(timeout=PLAIN_RUNS_MS)
    page.locator(".jp-NotebookPanel:visible .jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    output = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output")
    expect(output).to_have_text("plain ran", timeout=PLAIN_RUNS_MS)
    ui.shot("plain-ran-beside-the-queue")

    # The three still wait (nothing was admitted meanwhile): the plain kernel was not held up.
    still = [k for k in ui.kernels().values() if (k.get("queue") or {}).get("state") == "queued"]
    assert len(still) == 3, still
