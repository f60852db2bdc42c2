"""`jupyter kernel-queue status` as a user runs it against a real server: each kernel's
notebook, its place in the queue, how long it has waited, the machine's capacity line, and the
sentences for a wrong token and for no server."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from kernel_queue.cli import status
from tests.cli_support import kernel_queue
from tests.conftest import KernelspecFactory, Server


async def open_notebook(server: Server, path: str, kernel_id: str) -> None:
    """A session for `path` on an existing kernel, as JupyterLab makes when it opens one."""
    body = {"path": path, "name": Path(path).name, "type": "notebook", "kernel": {"id": kernel_id}}
    await server.fetch("api", "sessions", method="POST", body=json.dumps(body))


async def test_status_lists_kernels_with_their_place_in_the_queue(
    server: Server,
    kernelspec: KernelspecFactory,
    url: str,
    token: str,
    user_env: dict[str, str],
) -> None:
    name = kernelspec(gpus=2)
    running, queued = await server.hold_and_queue(name)

    code, out, err = await kernel_queue(user_env, "status", "--url", url, "--token", token)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "KERNEL",
        "NOTEBOOK",
        "KERNELSPEC",
        "STATE",
        "QUEUE",
        "POSITION",
        "WAITING",
        "GPUS",
        "MESSAGE",
    ]
    rows = {line[:8]: line for line in lines[1:]}
    assert rows[running[:8]].split()[1:5] == ["-", "queued", "running", "gpu"]
    assert "queued in 'gpu', position 1 of 1, needs 2 GPUs" in rows[queued[:8]]
    assert rows[queued[:8]].split()[3:7] == ["queued", "gpu", "1", "of"]
    await server.shutdown_and_wait(queued, running)


async def test_status_shows_each_kernels_notebook_its_wait_and_the_capacity(
    server: Server,
    kernelspec: KernelspecFactory,
    url: str,
    token: str,
    user_env: dict[str, str],
) -> None:
    running = await server.start_running(kernelspec("one", gpus=1))
    waiting = await server.start(kernelspec("two", gpus=2))
    await server.wait_reason(waiting, "position 1 of 1")
    await open_notebook(server, "work/analysis.ipynb", running)
    await open_notebook(server, "work/train.ipynb", waiting)
    api_only = await server.start(kernelspec("cpu", gpus=0, queue="cpu"))  # no notebook
    assert (await server.execute(api_only, "2"))["data"] == "2"

    env = {**user_env, "JUPYTER_TOKEN": token}  # the token from the environment
    code, out, err = await kernel_queue(env, "status", "--url", url)
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[0].split() == list(status.TABLE)
    starts = {name: lines[0].index(name) for name in status.TABLE}
    table = {line[:8]: line for line in lines[1:-1]}
    assert set(table) == {running[:8], waiting[:8], api_only[:8]}

    def cell(kernel_id: str, column: str) -> str:
        line = table[kernel_id[:8]]
        after = status.TABLE.index(column) + 1
        end = starts[status.TABLE[after]] if after < len(status.TABLE) else len(line)
        return line[starts[column] : end].strip()

    assert cell(running, "NOTEBOOK") == "work/analysis.ipynb"
    assert cell(waiting, "NOTEBOOK") == "work/train.ipynb"
    assert cell(api_only, "NOTEBOOK") == "-"
    assert cell(running, "WAITING") == ""
    assert re.fullmatch(r"\d+ s", cell(waiting, "WAITING")), cell(waiting, "WAITING")
    assert cell(waiting, "STATE") == "queued"
    assert cell(waiting, "POSITION") == "1 of 1"
    assert lines[-1] == "GPUs: 1 of 2 in use; 1 waiting"
    await server.shutdown_and_wait(api_only, waiting, running)


async def test_status_says_the_token_was_rejected_or_no_server_answers(
    server: Server,
    url: str,
    user_env: dict[str, str],
) -> None:
    code, out, err = await kernel_queue(user_env, "status", "--url", url, "--token", "wrong")
    assert (code, out, err) == (
        1,
        "",
        f"jupyter kernel-queue status: the server at {url} rejected the token; pass --token "
        "(or set JUPYTER_TOKEN)\n",
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    code, out, err = await kernel_queue(user_env, "status", "--url", gone)
    assert (code, out, err) == (
        1,
        "",
        f"jupyter kernel-queue status: no Jupyter server at {gone}; start one with "
        "`jupyter lab` or pass --url\n",
    )
    elsewhere = {**user_env, "JUPYTER_RUNTIME_DIR": user_env["HOME"]}  # no server files there
    code, out, err = await kernel_queue(elsewhere, "status")
    assert (code, err) == (
        1,
        "jupyter kernel-queue status: no running Jupyter server found; start one with "
        "`jupyter lab` or pass --url\n",
    )
