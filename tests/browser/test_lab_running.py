"""JupyterLab's Running sidebar has a "Kernel Queue" section: with one pretend GPU, the second of
two notebooks waits there (its sentence as tooltip), a click shows its notebook, its shutdown
button takes it out of the queue and off the server, and "Shut Down All" asks first, as
JupyterLab's own sections do. And the queues dialog ("Kernel Queue: Show queues") shows a failed
kernel's long kernelspec error whole, wrapped inside the dialog, never cut off at its edge.

Uses the `ui` fixture of tests/browser/conftest.py (a real `jupyter kernel-queue lab` with 1
pretend GPU, Debian's Chromium); screenshots in `test-artifacts/browser/<test>/`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.browser.lab import (
    CURRENT_TAB,
    KERNEL_WAIT_MS,
    Lab,
    api,
    write_kernelspec,
    write_notebook,
)
from tests.polling import until_sync

SECTION = "Kernel Queue"
WAITING_SENTENCE = re.compile(r"^queued in 'gpu', position 1 of 1")


def _server_kernels(base: str) -> set[str]:
    """The ids `GET /api/kernels` lists (JupyterLab's own listing, not ours)."""
    return {kernel["id"] for kernel in api(base, "api/kernels")}


class Sidebar:
    """JupyterLab's Running sidebar and its Kernel Queue section, as a user finds them."""

    def __init__(self, ui: Lab) -> None:
        self.ui, self.page, self.expect = ui, ui.page, ui.expect
        self.panel = self.page.locator("#jp-running-sessions")
        # The accordion's title of our section; it names the section's widget (aria-controls).
        self.title = self.panel.locator(".lm-AccordionPanel-title", has_text=SECTION)

    def open(self) -> None:
        """The left bar's Running tab (a click on it while it shows would close it)."""
        if not self.panel.is_visible():
            self.page.locator('.jp-SideBar.jp-mod-left [data-id="jp-running-sessions"]').click()
        self.expect(self.panel).to_be_visible()
        self.expect(self.title).to_be_visible()
        if self.title.get_attribute("aria-expanded") != "true":
            self.title.click()
        self.expect(self.title).to_have_attribute("aria-expanded", "true")

    def open_notebook(self, name: str) -> None:
        """Open a notebook from the file browser, then come back to the Running sidebar."""
        self.page.locator('.jp-SideBar.jp-mod-left [data-id="filebrowser"]').click()
        self.ui.open_notebook(name)
        self.open()

    @property
    def section(self) -> Any:
        return self.panel.locator(f"#{self.title.get_attribute('aria-controls')}")

    @property
    def items(self) -> Any:
        return self.section.locator(".jp-RunningSessions-item")

    def item(self, name: str) -> Any:
        return self.items.filter(has_text=name)


def test_the_sidebar_lists_the_waiting_notebook_and_its_shutdown_takes_it_off_the_server(
    ui: Lab, page: Any
) -> None:
    expect, status = ui.expect, ui.status
    # JupyterLab's /api/nbconvert answer is awaited after the load (see test_lab_queue_ui's
    # failed-kernel test: a server stopped while it is pending never exits).
    with page.expect_response(lambda r: "/api/nbconvert" in r.url, timeout=KERNEL_WAIT_MS):
        ui.goto("lab/tree/first.ipynb")
    ui.runs()
    first_kernel = status.get_attribute("data-kernel-id")
    sidebar = Sidebar(ui)
    sidebar.open()
    # A running kernel is JupyterLab's Kernels section's, not ours.
    expect(sidebar.items).to_have_count(0)
    expect(
        sidebar.panel.locator(".jp-RunningSessions-item", has_text="first.ipynb")
    ).not_to_have_count(0)
    ui.shot("first-running-section-empty")

    # The second notebook waits for the only GPU: the section lists it, by notebook, with the
    # queued icon, its short label and the server's whole sentence as tooltip.
    sidebar.open_notebook("second.ipynb")
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    second_kernel = status.get_attribute("data-kernel-id")
    assert second_kernel and second_kernel != first_kernel
    item = sidebar.item("second.ipynb")
    expect(sidebar.items).to_have_count(1)
    expect(item).to_have_class(re.compile(r"\bjp-KernelQueue-running-queued\b"))
    label = item.locator(".jp-RunningSessions-itemLabel")
    expect(label).to_have_text("second.ipynb")
    expect(label).to_have_attribute("title", WAITING_SENTENCE)
    sentence = ui.kernels()[second_kernel]["queue"]["message"]
    expect(label).to_have_attribute("title", sentence)  # the whole sentence, not a shortening
    expect(item.locator(".jp-RunningSessions-itemDetail")).to_have_text("Queued · #1 in gpu")
    expect(item.locator(".jp-RunningSessions-icon svg")).to_be_visible()
    item.hover()  # shows the item's shutdown button
    ui.shot("second-waits-in-the-section")

    # A click on the item shows its notebook.
    ui.tab("first.ipynb").click()
    expect(ui.tab("first.ipynb")).to_have_class(CURRENT_TAB)
    label.click()
    expect(ui.tab("second.ipynb")).to_have_class(CURRENT_TAB)

    # Its shutdown button leaves the queue: the server no longer lists the kernel, the section
    # empties and the first kernel runs on.
    # (JupyterLab's item button: its title is its tooltip, the shutdown label we give.)
    leave = item.locator(".jp-RunningSessions-itemShutdown")
    expect(leave).to_have_attribute(
        "title", "Leave the queue: shut down the waiting kernel of second.ipynb"
    )
    leave.click()
    until_sync(
        lambda: second_kernel not in _server_kernels(ui.base),
        "the waiting kernel gone from GET /api/kernels",
        within=30,
    )
    expect(sidebar.items).to_have_count(0)
    assert first_kernel in _server_kernels(ui.base)
    assert ui.kernels()[first_kernel]["queue"]["state"] in ("running", "resumed")
    ui.shot("second-left-the-queue")

    # Shut Down All asks first, with the section's own sentence; Cancel keeps the kernel.
    sidebar.open_notebook("third.ipynb")
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    third_kernel = status.get_attribute("data-kernel-id")
    expect(sidebar.item("third.ipynb")).to_have_count(1)
    shut_all = sidebar.title.get_by_role("button", name="Shut Down All")
    shut_all.click()
    dialog = page.locator(".jp-Dialog", has_text="Shut Down All?")
    expect(dialog.locator(".jp-Dialog-body")).to_have_text(
        "Shut down the 1 kernel listed under Kernel Queue? Waiting kernels leave their queue; "
        "any variables are lost."
    )
    ui.shot("shut-down-all-asks")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(sidebar.items).to_have_count(1)
    assert third_kernel in _server_kernels(ui.base)
    shut_all.click()
    dialog.get_by_role("button", name="Shut Down All").click()
    until_sync(
        lambda: third_kernel not in _server_kernels(ui.base),
        "the third kernel gone from GET /api/kernels",
        within=30,
    )
    expect(sidebar.items).to_have_count(0)
    expect(shut_all).to_be_disabled()
    assert first_kernel in _server_kernels(ui.base)
    ui.shot("shut-down-all-done")


# A kernelspec key a user might misspell (camelCase, as in JavaScript): one long word, wider
# than JupyterLab's dialog unless the sentence may break inside it.
LONG_KEY = "checkpointDirectoryOnTheSharedScratchVolumeOfTheComputerVisionTeamForSegmentationRuns"

OVERFLOWING = """(body) => [body, ...body.querySelectorAll('*')]
    .filter(e => e.clientWidth > 0 && e.scrollWidth > e.clientWidth)
    .map(e => `${e.tagName}.${e.className}: ${e.scrollWidth} > ${e.clientWidth}`)"""
"""The dialog body and each element in it that is wider inside than it shows (cut off, or
scrolled sideways)."""

OUTSIDE = """(reason) => {
    const box = reason.closest('.jp-Dialog-body').getBoundingClientRect();
    const range = document.createRange();
    range.selectNodeContents(reason);
    return [...range.getClientRects()]
      .filter(r => r.left < box.left - 0.5 || r.right > box.right + 0.5)
      .map(r => `${r.left}..${r.right} outside ${box.left}..${box.right}`);
}"""
"""The lines of the sentence's text that reach outside the dialog body."""


def test_the_queues_dialog_shows_a_failed_kernels_long_sentence_whole_inside_the_dialog(
    ui: Lab, page: Any, tmp_path: Path
) -> None:
    expect, status = ui.expect, ui.status
    write_kernelspec(tmp_path / "data", "typo", **{LONG_KEY: "/scratch"})
    write_notebook(tmp_path / "notebooks" / "typo.ipynb", "typo")
    with page.expect_response(lambda r: "/api/nbconvert" in r.url, timeout=KERNEL_WAIT_MS):
        ui.goto("lab/tree/typo.ipynb")  # (awaited as above)
    expect(status).to_have_text("Failed · kernelspec error", timeout=KERNEL_WAIT_MS)
    kernel = status.get_attribute("data-kernel-id")
    sentence = ui.kernels()[kernel]["queue"]["message"]
    assert LONG_KEY in sentence and len(sentence) > 300, sentence

    # The queues dialog (the command palette's) lists the failed kernel with its sentence, as
    # text wrapped inside the dialog: nothing in the body is cut off or scrolls sideways.
    dialog = ui.open_queues()
    failure = dialog.locator(f'.jp-KernelQueue-failure[data-kernel-id="{kernel}"]')
    expect(failure.locator("h4")).to_have_text("typo.ipynb: Failed · kernelspec error")
    reason = failure.locator(".jp-KernelQueue-reason")
    expect(reason).to_have_text(sentence)
    expect(reason).to_be_visible()
    body = dialog.locator(".jp-Dialog-body")
    assert body.evaluate(OVERFLOWING) == []
    assert reason.evaluate(OUTSIDE) == []
    height = reason.evaluate("(e) => e.getBoundingClientRect().height")
    line = reason.evaluate("(e) => parseFloat(getComputedStyle(e).lineHeight) || 16")
    assert height >= 3 * line, (height, line)  # wrapped over several lines
    ui.shot("failed-sentence-wrapped-in-the-dialog")

    # Its Shut down button ends the failed kernel: the server no longer lists it.
    failure.get_by_role("button", name="Shut down the failed kernel of typo.ipynb").click()
    expect(failure).to_have_count(0)
    until_sync(
        lambda: kernel not in _server_kernels(ui.base),
        "the failed kernel gone from GET /api/kernels",
        within=30,
    )
    ui.shot("failed-kernel-shut-down")
