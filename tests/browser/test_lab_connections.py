"""Queued kernels hold no connection open in JupyterLab: with the only GPU taken, three notebooks
wait in the queue and a plain "Python 3 (ipykernel)" notebook opened after them still runs its
cell within seconds (a browser lets one websocket per host be CONNECTING at a time, so a
waiting kernel's held upgrade used to keep every later notebook on "Connecting").

Uses the `ui` fixture of tests/browser/conftest.py (a real `jupyter kernel-queue lab` with 1
pretend GPU, Debian's Chromium); screenshots in `test-artifacts/browser/<test>/`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.browser.lab import CURRENT_TAB, KERNEL_WAIT_MS, Lab, api, write_notebook
from tests.polling import until_sync

PLAIN_RUNS_MS = 30_000
"""A plain ipykernel starts in a few seconds here; a blocked websocket never connects."""
QUEUED = re.compile(r"Queued · #[123] in gpu")


def _start_kernel(base: str, name: str) -> str:
    """POST /api/kernels, as a script or another client would: the kernel's id."""
    return str(api(base, "api/kernels", "POST", {"name": name})["id"])


def test_a_plain_notebook_runs_at_once_beside_three_queued_ones(
    ui: Lab, page: Any, tmp_path: Path
) -> None:
    expect = ui.expect
    write_notebook(tmp_path / "notebooks" / "plain.ipynb", "python3", "print('plain ran')")
    holder = _start_kernel(ui.base, "python3-gpu-queued")  # takes the only GPU

    def holds() -> bool:
        return (ui.kernels()[holder].get("queue") or {}).get("state") == "running"

    until_sync(holds, "the REST kernel running on the only GPU", within=KERNEL_WAIT_MS / 1000)

    ui.goto("lab/tree/first.ipynb")
    expect(ui.tab("first.ipynb")).to_have_class(CURRENT_TAB)
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
