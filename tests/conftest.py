"""Shared fixtures: a real jupyter_server (pytest-jupyter) configured as our etc/jupyter file
configures it, kernelspecs written into the test's own data dir, and small helpers to talk to
kernels over the server's REST and websocket APIs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.apiserver import crds as crd_files
from tornado.httpclient import HTTPClientError

from kernel_queue import model
from kernel_queue.events import SCHEMA_ID
from tests import polling
from tests.messages import execute_request

# pytest-jupyter's core plugin first: the fake cluster's tests (packages/fake-cluster/tests, run
# beside these) name it in their own conftest, and a plugin imported before it is registered
# could not be rewritten.
pytest_plugins = [
    "pytest_jupyter.jupyter_core",
    "jupyter_server.pytest_plugin",
    "kernel_queue_fake_cluster.plugin",
    "tests.leftovers",
    "tests.workers",
]

REPO = Path(__file__).resolve().parent.parent
SERVER_CONFIG = REPO / "etc" / "jupyter" / "jupyter_server_config.d" / "kernel_queue.json"
KUEUE_DATA = REPO.parent / "shared" / "data" / "kueue"
"""Kueue's CRDs and example manifests next to the checkout (never copied into it)."""
KUEUE_CRDS = Path(os.environ.get(crd_files.ENVIRONMENT_VARIABLE) or KUEUE_DATA / "crds")
"""The CRDs the fake cluster reads in these tests: the variable's path, else the checkout's."""
os.environ.setdefault(crd_files.ENVIRONMENT_VARIABLE, str(KUEUE_CRDS))
# A machine's real system queue service (/run/kernel-queue) is never the tests': local-backend
# tests start their own per-user one; the system-service tests point this at theirs.
os.environ["KERNEL_QUEUE_SYSTEM_SOCKET"] = str(
    Path(tempfile.gettempdir()) / f"kernel-queue-tests-{os.getpid()}" / "no-system-service.sock"
)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """Kernels a test starts run as they do for users: ipykernel 7 turns its capture of fd 1
    and 2 into the notebook off where PYTEST_CURRENT_TEST is set, and kernels inherit the
    server's environment, so it is unset while the test function runs (pytest sets it again)."""
    saved = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        return (yield)
    finally:
        if saved is not None:
            os.environ["PYTEST_CURRENT_TEST"] = saved


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "local_gpus(*ids): the local backend's GPUs for the test server (default 0, 1)"
    )


@pytest.fixture
def local_backend_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """`c.LocalBackend` for the test server: 2 GPUs by default, those of the test's
    `local_gpus` mark (`pytestmark = pytest.mark.local_gpus("0")`) where it has one; tests
    override keys."""
    mark = request.node.get_closest_marker("local_gpus")
    return {"gpus": list(mark.args) if mark else ["0", "1"]}


@pytest.fixture
def jp_server_config(local_backend_config: dict[str, Any]) -> dict[str, Any]:
    """The shipped server config, plus the local backend's inventory."""
    config: dict[str, Any] = json.loads(SERVER_CONFIG.read_text())
    config["LocalBackend"] = local_backend_config
    config.setdefault("MappingKernelManager", {})["default_kernel_name"] = "queued"
    return config


KernelspecFactory = Callable[..., str]


@pytest.fixture
def kernelspec(jp_kernel_dir: Path) -> KernelspecFactory:
    """Write a queued kernelspec into the test's data dir; return its name."""

    def write(name: str = "queued", metadata: dict[str, Any] | None = None, **config: Any) -> str:
        config.setdefault("backend", "local")
        config.setdefault("queue", "gpu")
        config.setdefault("startup_timeout", 60)
        spec = {
            "argv": ["python", "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"],
            "display_name": f"Queued {name}",
            "language": "python",
            "interrupt_mode": "message",
            "metadata": {
                **(metadata or {}),
                "kernel_provisioner": {"provisioner_name": "kernel-queue", "config": config},
            },
        }
        folder = jp_kernel_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.json").write_text(json.dumps(spec))
        return name

    return write


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """The local checkpoint store of a test's kernels (created by the first save)."""
    return tmp_path / "checkpoints"


class Server:
    """Drive the test server the way a notebook client does."""

    def __init__(self, fetch: Any, ws_fetch: Any, serverapp: Any) -> None:
        self.fetch = fetch
        self.ws_fetch = ws_fetch
        self.app = serverapp

    def backend(self) -> Any:
        """The server's local backend (for assertions on what it holds)."""
        from kernel_queue import backends

        return backends.get_backend("local", owner=self.app.kernel_manager, config=None, log=None)

    async def start(self, name: str, kernel_id: str | None = None) -> str:
        """POST a kernel of kernelspec `name` (with the id the client asks for, if given)."""
        body = {"name": name} | ({"kernel_id": kernel_id} if kernel_id else {})
        response = await self.fetch("api", "kernels", method="POST", body=json.dumps(body))
        return str(json.loads(response.body)["id"])

    async def start_running(self, name: str) -> str:
        """Start a kernel of `name` and wait until it runs a cell (`1` answers `1`)."""
        kernel_id = await self.start(name)
        assert (await self.execute(kernel_id, "1"))["data"] == "1"
        return kernel_id

    async def hold_and_queue(self, name: str) -> tuple[str, str]:
        """A running kernel of `name` holding what it asked for, and a second one waiting first
        in line behind it: (holder, queued)."""
        holder = await self.start_running(name)
        queued = await self.start(name)
        await self.wait_reason(queued, "position 1 of 1")
        return holder, queued

    async def start_in_notebook(self, name: str, path: str) -> str:
        """POST a session of notebook `path` with a kernel of `name`, as JupyterLab does when it
        opens a notebook; the kernel's id."""
        body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": name}}
        response = await self.fetch("api", "sessions", method="POST", body=json.dumps(body))
        return str(json.loads(response.body)["kernel"]["id"])

    def queue_state(self, kernel_id: str) -> str:
        """The kernel's state as the queue's status says it (`parked`, `running`, ...)."""
        from kernel_queue.server import kernels

        status = kernels.queue_status(self.app.kernel_manager.get_kernel(kernel_id))
        return str((status or {}).get("state"))

    async def model(self, kernel_id: str) -> dict[str, Any]:
        response = await self.fetch("api", "kernels", kernel_id, method="GET")
        return dict(json.loads(response.body))

    async def kernel_ids(self) -> set[str]:
        response = await self.fetch("api", "kernels", method="GET")
        return {k["id"] for k in json.loads(response.body)}

    async def shutdown(self, kernel_id: str) -> None:
        await self.fetch("api", "kernels", kernel_id, method="DELETE")

    async def shutdown_and_wait(self, *kernel_ids: str) -> None:
        """DELETE the kernels and wait until they and their launchers are gone."""
        for kernel_id in kernel_ids:
            await self.shutdown(kernel_id)
        await self.wait_gone(*kernel_ids)

    async def wait_gone(self, *kernel_ids: str) -> None:
        """Wait until the kernels have left `/api/kernels` and their launchers are gone (a
        kernel that ran when its DELETE came stays listed until its shutdown ends)."""

        async def gone() -> bool:
            return not (await self.kernel_ids()) & set(kernel_ids)

        async def no_launchers() -> bool:
            return not launcher_pids(kernel_ids)

        await self.wait_for(gone)
        await self.wait_for(no_launchers)

    async def wait_for(
        self,
        check: Callable[[], Awaitable[object] | object],
        *,
        within: float = polling.WITHIN,
        what: str = "",
        detail: Callable[[], object] | None = None,
    ) -> None:
        """Poll the server (as a REST client would) until `check` holds, for at most `within` s;
        `what` names the condition in the failure (default: the check's own name)."""
        what = what or getattr(check, "__name__", "the condition").replace("_", " ")
        await polling.until(check, what, within=within, detail=detail)

    async def failure(self, name: str, within: float = 60) -> tuple[str, dict[str, Any]]:
        """Start a kernel of kernelspec `name` and wait until it is dead: its id and model."""
        kernel_id = await self.start(name)

        async def dead() -> bool:
            return (await self.model(kernel_id))["execution_state"] == "dead"

        await self.wait_for(dead, within=within)
        return kernel_id, await self.model(kernel_id)

    async def wait_reason(self, kernel_id: str, text: str, within: float = 60) -> dict[str, Any]:
        """Wait until the kernel's `reason` contains `text`; return the model."""
        seen: dict[str, Any] = {}

        async def check() -> bool:
            seen.update(await self.model(kernel_id))
            return text in seen.get("reason", "")

        await self.wait_for(
            check, within=within, what=f"a reason containing {text!r}", detail=lambda: seen
        )
        return seen

    async def execute(
        self, kernel_id: str, code: str, within: float = 60, *, history: bool = False
    ) -> dict[str, Any]:
        """Run `code` through the kernel's websocket; return the execute_result data, the
        stream text, the error's name, the reply's status and execution_count. Like JupyterLab,
        the new connection asks for kernel_info first (in the same session), and does not wait
        for its reply. `history`: stored as a notebook's cell is (it gets its number)."""
        ws = await self.ws_fetch("api", "kernels", kernel_id, "channels")
        request = execute_request(code)
        request["content"]["store_history"] = history
        msg_id, session = request["header"]["msg_id"], request["header"]["session"]
        info = {"msg_id": uuid.uuid4().hex, "msg_type": "kernel_info_request", "version": "5.3"}
        info |= {"session": session, "username": "test", "date": ""}
        hello = {"header": info, "parent_header": {}, "metadata": {}, "content": {}}
        result: dict[str, Any] = {"stream": "", "data": None, "status": None, "error": None}
        seen: list[str] = []  # every message type that came, with its parent's
        try:
            async with asyncio.timeout(within):
                await ws.write_message(json.dumps({**hello, "channel": "shell", "buffers": []}))
                await ws.write_message(json.dumps(request))
                while result["status"] is None or result["idle"] is not True:
                    raw = await ws.read_message()
                    if raw is None:
                        raise AssertionError(f"websocket closed; it had sent {seen}")
                    msg = json.loads(raw)
                    parent = msg.get("parent_header", {})
                    seen.append(f"{msg.get('msg_type')}<{parent.get('msg_type', '')}")
                    if parent.get("msg_id") != msg_id:
                        continue
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "stream":
                        result["stream"] += content["text"]
                    elif kind == "execute_result":
                        result["data"] = content["data"].get("text/plain")
                    elif kind == "error":
                        result["error"] = content["ename"]
                    elif kind == "execute_reply":
                        result["status"] = content["status"]
                        result["count"] = content.get("execution_count")
                    elif kind == "status":
                        result["idle"] = content["execution_state"] == "idle"
                    result.setdefault("idle", False)
        except TimeoutError:
            try:
                model = await self.model(kernel_id)
            except HTTPClientError as error:  # the kernel is gone: that is what it reads
                model = {"execution_state": f"no kernel (HTTP {error.code})"}
            raise TimeoutError(  # still a timeout to the tests that expect one
                f"the cell {code!r} did not finish within {within} s: it got {result}; the "
                f"websocket sent {seen}; the kernel reads {model.get('execution_state')!r}, "
                f"reason {model.get('reason')!r}"
            ) from None
        finally:
            ws.close()
        return result


class Listener:
    """Every message a notebook's websocket receives from one kernel, while it is open."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.messages = ws, []
        self.task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, server: Server, kernel_id: str) -> Listener:
        """Connect, and return once a reply came back: jupyter_server forwards a new
        connection's IOPub messages only after its kernel_info "nudge" has finished."""
        ws = await server.ws_fetch("api", "kernels", kernel_id, "channels")
        header = {"msg_id": uuid.uuid4().hex, "msg_type": "kernel_info_request", "version": "5.3"}
        header |= {"session": uuid.uuid4().hex, "username": "test", "date": ""}
        request = {"header": header, "parent_header": {}, "metadata": {}, "content": {}}
        await ws.write_message(json.dumps({**request, "channel": "shell", "buffers": []}))
        while (raw := await ws.read_message()) is not None:
            if json.loads(raw).get("msg_type") == "kernel_info_reply":
                return cls(ws)
        raise AssertionError("the websocket closed before the kernel answered")

    @classmethod
    @contextlib.asynccontextmanager
    async def held(cls, server: Server, kernel_id: str) -> AsyncIterator[Listener]:
        """A listener open for the `async with` block, closed however the block ends."""
        listener = await cls.open(server, kernel_id)
        try:
            yield listener
        finally:
            listener.close()

    async def _read(self) -> None:
        while (raw := await self.ws.read_message()) is not None:
            self.messages.append(json.loads(raw))

    async def send(self, code: str) -> str:
        """Send a cell on this websocket, as JupyterLab does; its msg_id."""
        request = execute_request(code)
        request["content"]["store_history"] = False
        await self.ws.write_message(json.dumps(request))
        return str(request["header"]["msg_id"])

    def replies(self, msg_id: str) -> list[dict[str, Any]]:
        """The messages received so far whose parent is `msg_id`."""
        return [m for m in self.messages if m.get("parent_header", {}).get("msg_id") == msg_id]

    async def finished(self, server: Server, msg_id: str) -> list[dict[str, Any]]:
        """The cell's messages once its reply and its idle status came (on two sockets, shell
        and IOPub, so in either order)."""

        def done() -> bool:
            kinds = {
                (m["msg_type"], m["content"].get("execution_state")) for m in self.replies(msg_id)
            }
            return ("status", "idle") in kinds and ("execute_reply", None) in kinds

        await server.wait_for(done, what=f"cell {msg_id[:8]} finished", within=120)
        return self.replies(msg_id)

    def text(self) -> str:
        return "".join(
            m["content"].get("text", "") for m in self.messages if m.get("msg_type") == "stream"
        )

    def close(self) -> None:
        self.ws.close()
        self.task.cancel()


class EventLog:
    """Collects kernel-queue status events from `/api/events/subscribe`."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self, ws_fetch: Any) -> None:
        ws = await ws_fetch("api", "events", "subscribe")

        async def read() -> None:
            while (raw := await ws.read_message()) is not None:
                event = json.loads(raw)
                if event.get("schema_id") == SCHEMA_ID:
                    self.events.append(event)

        self._task = asyncio.get_running_loop().create_task(read())
        self._ws = ws

    def states(self, kernel_id: str) -> list[str]:
        """The distinct successive states reported for one kernel."""
        states: list[str] = []
        for event in self.events:
            if event["kernel_id"] == kernel_id and (not states or states[-1] != event["state"]):
                states.append(event["state"])
        return states

    async def stop(self) -> None:
        self._ws.close()
        if self._task is not None:
            self._task.cancel()


@pytest.fixture
def event_log(jp_ws_fetch: Any, jp_asyncio_loop: asyncio.AbstractEventLoop) -> Any:
    """Subscribed before the test's kernels start (pytest-jupyter runs no async fixtures)."""
    log = EventLog()
    jp_asyncio_loop.run_until_complete(log.start(jp_ws_fetch))
    yield log
    jp_asyncio_loop.run_until_complete(log.stop())


@pytest.fixture
def url(jp_base_url: str, jp_http_port: int) -> str:
    """The test server's base URL on its real port (for a client in another thread)."""
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}"


@pytest.fixture
def token(jp_auth_header: dict[str, str]) -> str:
    """The test server's token."""
    return jp_auth_header["Authorization"].split()[-1]


@pytest.fixture
def server(jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any) -> Server:
    return Server(jp_fetch, jp_ws_fetch, jp_serverapp)


def processes() -> dict[int, tuple[int, list[bytes], list[bytes]]]:
    """Every process this user can read: pid -> (parent pid, command line, environ at start)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline, environ)
    return found


def spare_launchers() -> set[int]:
    """Spare launchers of this test process that wait for a kernel (no child yet)."""
    running = processes()
    busy = {parent for parent, _, _ in running.values()}
    return {
        pid
        for pid, (parent, cmdline, _) in running.items()
        if parent == os.getpid() and b"--spare" in cmdline and pid not in busy
    }


def _log_of(pid: int) -> str:
    """The file a launcher writes its stderr to (the local backend: the kernel's log)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return ""


def errors_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The server log's ERROR (and worse) lines a test captured."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def tracebacks_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The captured lines above DEBUG that carry a traceback."""
    return [r.getMessage() for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG]


def launcher_pids(kernel_ids: tuple[str, ...] = ()) -> set[int]:
    """Launcher processes that are children of this test process (of these kernels, if given).

    A launcher is known by its KERNEL_ID, or its kernel's. A spare launcher (`--spare`, started
    ahead by the local backend) counts once it runs a kernel, and is known by the log it writes
    to, named for the kernel's group: its /proc environ is the one it started with, before it
    took its kernel's, and so is that of the kernel it forks (`supervisor.fork_arguments`)."""
    running = processes()
    found = set()
    for pid, (parent, cmdline, environ) in running.items():
        if parent != os.getpid() or b"kernel_queue.launcher" not in cmdline:
            continue
        kernels = [env for p, (up, _, env) in running.items() if up == pid]
        if b"--spare" in cmdline and not kernels:
            continue  # a spare waiting for a kernel
        if kernel_ids and not any(
            f"KERNEL_ID={k}".encode() in env for env in [environ, *kernels] for k in kernel_ids
        ):
            log = os.path.basename(_log_of(pid))
            if not any(log == f"{model.group_name(k)}.log" for k in kernel_ids):
                continue
        found.add(pid)
    return found


@pytest.fixture(scope="session")
def real_planes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's real control planes (`tests.kube.planes.RealPlanes`), one per Kueue
    release, started when a test first asks for one and stopped at the end of the session."""
    from tests.kube.planes import RealPlanes

    planes = RealPlanes(tmp_path_factory.mktemp("control-planes"))
    yield planes
    planes.close()


def real_plane_ready() -> None:
    """Return once the real control plane is built (waiting for a build in progress, or
    building it); skip, saying why, where it cannot be (never under CI)."""
    from kernel_queue_fake_cluster.control_plane import build

    if build.built() is None:
        why = build.missing_go()
        if why is not None:
            skip_unless_ci(f"the real control plane cannot run here: {why}")
        build.build()  # waits for the background build `scripts/test` started, else builds


def skip_unless_ci(message: str) -> None:
    """Skip with `message`, or fail with it in CI (`KQ_CI=1`, set by .ci/run, or `CI=true`)
    where a missing prerequisite must not hide a suite; it never returns."""
    if os.environ.get("KQ_CI") == "1" or os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)
