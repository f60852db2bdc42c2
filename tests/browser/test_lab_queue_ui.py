"""JupyterLab in headless Chromium shows the queue: two notebooks share one GPU, the second
waits and says so, runs when the first is shut down (with a notification), and a queued kernel
is cancelled from the panel; a preempted notebook says why, waits again and resumes, and a
kernel that gives up waiting says so; a kernel parked from the panel reads Parked, its next cell
brings it back and prints, and the panel's Resume wakes it too.

A real `jupyter kernel-queue lab` (local backend, 1 pretend GPU, token auth, private Jupyter
dirs) and Debian's Chromium driven by Playwright; never a downloaded browser (`tests/browser/
lab.py`, the fixtures in its conftest.py). Screenshots of each step and the server's log go to
`test-artifacts/browser/<test>/`; assertions read the DOM.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.browser.lab import CURRENT_TAB, KERNEL_WAIT_MS, LAB_ENV, Lab, write_notebook
from tests.cli_support import JUPYTER
from tests.polling import until_sync

pytestmark = pytest.mark.timeout(300)


def test_the_second_notebook_waits_runs_when_the_first_stops_and_cancel_leaves_the_queue(
    ui: Lab,
) -> None:
    _scenario(ui)


def _scenario(lab: Lab) -> None:
    expect, status = lab.expect, lab.status
    lab.goto("lab/tree/first.ipynb")
    expect(lab.tab("first.ipynb")).to_have_class(CURRENT_TAB)
    lab.runs()  # nothing of ours beside JupyterLab's "Idle"
    expect(status).to_be_hidden()
    first_kernel = status.get_attribute("data-kernel-id")
    lab.shot("first-running")

    # The second notebook's kernel waits for the only GPU, and says where: in the status bar
    # (icon, colour, the sentence as tooltip) and in the notebook's toolbar.
    lab.open_notebook("second.ipynb")
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    expect(status).to_have_class(re.compile(r"\bjp-KernelQueue-tone-queued\b"))
    expect(status).to_have_attribute("title", re.compile(r"^queued in 'gpu', position 1 of 1"))
    expect(status).to_have_attribute(
        "aria-label", re.compile(r"^Kernel queue: Queued · #1 in gpu\. ")
    )
    expect(status.locator(".jp-KernelQueue-icon svg")).to_be_visible()
    expect(lab.indicator).to_have_text("Waiting for 1 GPU · #1 in gpu")
    expect(lab.indicator).to_have_attribute("role", "status")
    expect(lab.indicator).to_have_attribute("title", re.compile(r"^queued in 'gpu', position 1"))
    second_kernel = status.get_attribute("data-kernel-id")
    assert second_kernel and second_kernel != first_kernel
    lab.shot("second-queued")

    # Each notebook shows its own kernel: the first runs, and others wait.
    lab.tab("first.ipynb").click()
    expect(status).to_have_text("Queue · 1 waiting")
    expect(status).to_have_attribute("data-kernel-id", first_kernel)
    expect(lab.indicator).to_be_hidden()
    lab.tab("second.ipynb").click()
    expect(status).to_have_text("Queued · #1 in gpu")

    # A reload rebuilds the view from the server's listing (no event arrives meanwhile).
    lab.page.reload()
    expect(lab.tab("second.ipynb")).to_have_class(CURRENT_TAB)
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    lab.shot("second-queued-after-reload")

    # Shut the first kernel down from its notebook; the second is admitted and runs.
    lab.open_notebook("first.ipynb")  # the reload opened only the second
    expect(status).to_have_attribute("data-kernel-id", first_kernel)
    lab.runs()
    lab.shut_down_kernel()
    lab.open_notebook("second.ipynb")
    lab.runs()
    expect(lab.toast("second.ipynb: kernel admitted with 1 GPU after waiting")).to_be_visible()
    lab.gone(first_kernel)
    lab.shot("second-admitted")

    # A third notebook queues behind the second; the panel shows the queue's capacity, who
    # holds it and who waits, marks this notebook's row, closes on Escape, and the waiting
    # kernel leaves the queue from it.
    lab.open_notebook("third.ipynb")
    expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
    third_kernel = status.get_attribute("data-kernel-id")
    assert third_kernel in lab.kernels()
    status.click()
    panel = lab.page.locator(".jp-KernelQueue-panel")
    expect(panel).to_be_focused()
    expect(panel.locator(".jp-KernelQueue-capacity")).to_have_text(
        "GPUs: 1 of 1 in use · 1 waiting"
    )
    holder = lab.queue_row(second_kernel)
    expect(holder).to_have_attribute("data-role", "holder")
    expect(holder.locator("td").nth(0)).to_have_text("second.ipynb")
    expect(holder.locator("td").nth(1)).to_have_text(re.compile(r"^running · (busy|idle \d+ s)$"))
    expect(holder.locator("td").nth(2)).to_have_text("GPU 0")
    expect(
        holder.get_by_role("button", name="Shut down the kernel of second.ipynb")
    ).to_be_visible()
    row = lab.queue_row(third_kernel)
    expect(row).to_have_attribute("data-role", "waiting")
    expect(row).to_have_attribute("aria-current", "true")
    cells = row.locator("td")
    expect(cells.nth(0)).to_have_text("third.ipynbthis notebook")
    expect(cells.nth(1)).to_have_text(re.compile(r"^#1 of 1 · waiting \d+ s$"))
    expect(cells.nth(2)).to_have_text("1 GPU")
    expect(holder).not_to_have_attribute("aria-current", "true")
    lab.shot("panel-capacity-holder-and-current-row")
    lab.page.keyboard.press("Escape")
    expect(panel).to_have_count(0)
    expect(status).to_be_focused()
    lab.shot("panel-closed-by-escape")
    lab.page.keyboard.press("Enter")  # the focused item opens it again
    expect(panel).to_be_visible()
    row.get_by_role(
        "button", name="Leave the queue: shut down the waiting kernel of third.ipynb"
    ).click()
    expect(row).to_have_count(0)
    # Nothing waits any more and the third notebook has no kernel: the item goes away.
    expect(status).to_be_hidden()
    expect(lab.page.locator(".jp-NotebookPanel:visible .jp-KernelName")).to_have_text("No Kernel")
    lab.shot("third-left-the-queue")
    remaining = lab.gone(third_kernel)
    assert remaining[second_kernel]["queue"]["state"] == "running"


def test_preemption_requeue_resume_and_failure_are_told_with_their_reasons(
    ui: Lab, page: Any
) -> None:
    expect, status = ui.expect, ui.status
    low_kernel = ui.first_cell_run("low.ipynb")  # x = 41
    ui.shot("low-running")

    # The high-priority notebook takes the only GPU: the low one is preempted, saves, waits.
    ui.open_notebook("high.ipynb")
    ui.runs()
    high_kernel = status.get_attribute("data-kernel-id")
    assert high_kernel and high_kernel != low_kernel
    preempted = ui.toast("low.ipynb: preempted")
    expect(preempted).to_be_visible(timeout=KERNEL_WAIT_MS)
    # the reason, the preemptor named by its notebook once JupyterLab gave its session the
    # notebook's path (a new session's is a uuid for a moment)
    expect(preempted).to_contain_text(re.compile(r"by higher-priority (high\.ipynb \()?kernel "))
    expect(preempted).to_contain_text("saving its variables")
    # The low kernel's events (preempted, then requeued) do not touch the current notebook's
    # item: it still shows its own kernel.
    until_sync(
        lambda: (ui.kernels()[low_kernel]["queue"] or {}).get("state") == "requeued",
        "the low kernel requeued in the listing",
        within=KERNEL_WAIT_MS / 1000,
    )
    expect(ui.tab("high.ipynb")).to_have_class(CURRENT_TAB)
    expect(status).to_have_text("Queue · 1 waiting")
    expect(status).to_have_attribute("data-kernel-id", high_kernel)
    ui.tab("low.ipynb").click()
    expect(status).to_have_text("Requeued · #1", timeout=KERNEL_WAIT_MS)
    expect(status).to_have_class(re.compile(r"\bjp-KernelQueue-tone-preempted\b"))
    expect(ui.indicator).to_have_text("Requeued · #1")
    expect(status).to_have_attribute("data-kernel-id", low_kernel)
    ui.shot("low-requeued")

    # The high one ends: the low one comes back with its variables, and says so.
    ui.open_notebook("high.ipynb")
    ui.shut_down_kernel()
    ui.tab("low.ipynb").click()
    expect(ui.toast("low.ipynb: resumed")).to_contain_text(
        "variables restored from the checkpoint", timeout=KERNEL_WAIT_MS
    )
    # JupyterLab's own status reads "Idle" without a cell (it read "Starting": the resumed
    # kernel said only that), and the next cell has x back.
    ui.runs()
    ui.shot("low-resumed")
    assert ui.kernels()[low_kernel]["queue"]["state"] == "resumed"
    page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(1).click()
    page.keyboard.type("x + 1")
    page.keyboard.press("Shift+Enter")
    expect(
        page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output", has_text="42")
    ).to_be_visible(timeout=KERNEL_WAIT_MS)
    ui.runs()

    # A kernel that cannot wait fails, and the notification gives the error's sentence.
    ui.open_notebook("impatient.ipynb")
    failed = ui.toast("impatient.ipynb: kernel")
    expect(failed).to_contain_text(
        "without being admitted (admission_timeout)", timeout=KERNEL_WAIT_MS
    )
    expect(status).to_have_text("Failed · gave up waiting")
    expect(status).to_have_class(re.compile(r"\bjp-KernelQueue-tone-failed\b"))
    expect(status).to_have_attribute("title", re.compile(r"without being admitted"))
    ui.shot("impatient-failed")


def test_park_from_the_panel_then_the_next_cell_brings_the_kernel_back_and_prints(
    ui: Lab, page: Any
) -> None:
    expect, status = ui.expect, ui.status
    kernel = ui.first_cell_run("parks.ipynb")  # x = 41
    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")

    # The queues (from the command palette: the item hides while the kernel runs) offer
    # "Park now" for the running kernel; parked, the item says so.
    dialog = ui.open_queues()
    row = dialog.locator(f'.jp-KernelQueue-queueRow[data-kernel-id="{kernel}"]')
    expect(row.locator("td").nth(0)).to_have_text("parks.ipynbthis notebook")
    expect(row.locator("td").nth(1)).to_have_text(re.compile(r"^running"))
    ui.shot("panel-offers-park")
    row.get_by_role("button", name="Park the kernel of parks.ipynb").click()
    expect(status).to_have_text("Parked · GPU released", timeout=KERNEL_WAIT_MS)
    expect(status).to_have_class(re.compile(r"\bjp-KernelQueue-tone-parked\b"))
    expect(status).to_have_attribute(
        "title", re.compile(r"^parked on request; GPU released; your next cell brings it back")
    )
    resume = dialog.get_by_role("button", name="Resume the kernel of parks.ipynb")
    expect(resume).to_be_visible()
    ui.shot("parked")
    assert ui.kernels()[kernel]["queue"]["state"] == "parked"
    page.keyboard.press("Escape")  # JupyterLab's dialog closes on Escape
    expect(dialog).to_have_count(0)

    # A reload connects to the parked kernel at once (the server answers for it) and leaves
    # it parked: JupyterLab shows it idle, not connecting.
    page.reload()
    expect(status).to_have_text("Parked · GPU released", timeout=KERNEL_WAIT_MS)
    expect(page.locator("#jp-main-statusbar", has_text="Python 3 (parks) | Idle")).to_be_visible()
    assert ui.kernels()[kernel]["queue"]["state"] == "parked"
    ui.shot("parked-after-reload")

    # The next cell wakes it: it comes back with x and prints, once.
    cells.nth(1).click()
    page.keyboard.press("Shift+Enter")
    output = cells.nth(1).locator(".jp-OutputArea-output")
    expect(output.filter(has_text="back 42")).to_have_count(1, timeout=KERNEL_WAIT_MS)
    ui.runs()
    expect(ui.toast("parks.ipynb: resumed")).to_be_visible(timeout=KERNEL_WAIT_MS)
    ui.shot("woken-by-a-cell")

    # Parked again, the panel's Resume wakes it without a cell.
    dialog = ui.open_queues()
    dialog.get_by_role("button", name="Park the kernel of parks.ipynb").click()
    expect(status).to_have_text("Parked · GPU released", timeout=KERNEL_WAIT_MS)
    dialog.get_by_role("button", name="Resume the kernel of parks.ipynb").click()
    ui.runs()
    ui.shot("resumed-from-the-panel")
    assert ui.kernels()[kernel]["queue"]["state"] == "resumed"


def test_an_open_notebook_left_idle_parks_and_its_next_cell_brings_it_back(
    ui: Lab, page: Any
) -> None:
    expect, status = ui.expect, ui.status
    ui.first_cell_run("idles.ipynb")  # y = 6 * 7
    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")

    expect(status).to_have_text("Parked · GPU released", timeout=KERNEL_WAIT_MS)
    expect(ui.toast("idles.ipynb: parked after 3 s idle; GPU released")).to_be_visible()
    ui.shot("parked-while-open")
    page.keyboard.press("Shift+Enter")  # the second cell
    output = cells.nth(1).locator(".jp-OutputArea-output")
    expect(output.filter(has_text="awake 42")).to_have_count(1, timeout=KERNEL_WAIT_MS)
    ui.shot("awake")


def test_the_panel_shows_a_batch_run_holding_the_gpu_and_its_end_admits_the_notebook(
    ui: Lab, page: Any, tmp_path: Path
) -> None:
    expect, status = ui.expect, ui.status
    # A batch run on the same machine (same user) takes the only GPU first.
    held = tmp_path / "held"
    write_notebook(
        tmp_path / "hold.ipynb",
        "python3-gpu-queued",
        f"open({str(held)!r}, 'w').close()\nimport time\ntime.sleep(600)",
    )
    batch_log = (tmp_path / "batch.log").open("w")
    batch = subprocess.Popen(
        [
            *(JUPYTER, "nbconvert", "--to", "notebook", "--execute", str(tmp_path / "hold.ipynb")),
            "--ExecutePreprocessor.timeout=600",
        ],
        # The lab's settings (its --pretend-gpus 1), or the machine's queue refuses the run.
        env={**LAB_ENV[ui.base], "KERNEL_QUEUE_PRETEND_GPUS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=batch_log,
    )
    try:
        until_sync(
            held.exists,
            "the batch run's kernel running its cell",
            within=90,
            detail=lambda: (tmp_path / "batch.log").read_text()[-2000:],
        )
        ui.goto("lab/tree/first.ipynb")
        expect(status).to_have_text("Queued · #1 in gpu", timeout=KERNEL_WAIT_MS)
        status.click()
        panel = page.locator(".jp-KernelQueue-panel")
        expect(panel.locator(".jp-KernelQueue-capacity")).to_have_text(
            "GPUs: 1 of 1 in use · 1 waiting"
        )
        row = panel.locator(".jp-KernelQueue-queueRow", has_text="another process")
        expect(row).to_have_count(1)
        expect(row).to_have_attribute("data-role", "holder")
        expect(row.locator("td").nth(0)).to_have_text(
            re.compile(r"^kernel [0-9a-f]{8} \(another process, pid \d+\)$")
        )
        expect(row.locator("td").nth(1)).to_have_text("running")
        expect(row.locator("td").nth(2)).to_have_text("GPU 0")
        expect(row.get_by_role("button")).to_have_count(0)  # not this server's to shut down
        mine = panel.locator('.jp-KernelQueue-queueRow[aria-current="true"]')
        expect(mine).to_have_attribute("data-role", "waiting")
        ui.shot("panel-shows-the-batch-run")
        batch.send_signal(signal.SIGKILL)  # its lease ends with it: the notebook is next
        expect(row).to_have_count(0, timeout=KERNEL_WAIT_MS)
        expect(mine).to_have_attribute("data-role", "holder")
        page.keyboard.press("Escape")
        ui.runs()
        ui.shot("batch-gone-notebook-running")
    finally:
        batch.kill()
        batch.wait()
        batch_log.close()


@pytest.mark.parametrize(
    ("notebook", "label", "sentence"),
    [
        pytest.param(
            "toobig.ipynb",
            # What the status event's fields say (needs, and has: what the machine has in
            # all); the sentence is the tooltip.
            "Failed · needs 3 GPUs, 1 exists",
            r"asks for 3 GPU\(s\) but this machine has 1 (pretend )?GPU\(s\) in all",
            id="more-gpus-than-exist",
        ),
        pytest.param(
            "nosuch.ipynb",
            "Failed · no queue 'nosuch'",
            r"queue 'nosuch' does not exist on the local backend",
            id="unknown-queue",
        ),
    ],
)
def test_a_kernel_that_can_never_start_says_why_in_a_notification_and_its_label(
    ui: Lab, page: Any, notebook: str, label: str, sentence: str
) -> None:
    expect, status = ui.expect, ui.status
    # JupyterLab asks /api/nbconvert on each page load, answered from an AnyIO worker thread
    # in seconds; a server stopped while that request is pending never exits (the worker
    # outlives the stopped loop: jupyter_server and AnyIO, not ours). This test is over within
    # seconds of its last load, so it waits for that answer each time.
    with page.expect_response(lambda r: "/api/nbconvert" in r.url, timeout=KERNEL_WAIT_MS):
        ui.goto(f"lab/tree/{notebook}")
    toast = ui.toast(f"{notebook}: ")
    expect(toast).to_contain_text(re.compile(sentence), timeout=KERNEL_WAIT_MS)
    expect(status).to_have_text(label)
    expect(status).to_have_class(re.compile(r"\bjp-KernelQueue-tone-failed\b"))
    expect(status).to_have_attribute("title", re.compile(sentence))
    expect(ui.indicator).to_have_text(label)
    expect(ui.indicator).to_have_attribute("title", re.compile(sentence))
    ui.shot("failed")
    # A reload rebuilds it from the listing, which keeps the failed kernel with its queue.
    with page.expect_response(lambda r: "/api/nbconvert" in r.url, timeout=KERNEL_WAIT_MS):
        page.reload()
    expect(status).to_have_text(label, timeout=KERNEL_WAIT_MS)
    expect(status).to_have_attribute("title", re.compile(sentence))
    ui.shot("failed-after-reload")
