"""etc/jupyterhub/jupyterhub_config.py on one machine: a real JupyterHub (LocalProcessSpawner,
the shared-password authenticator, configurable-http-proxy from node_modules) on loopback ports,
two real unix users the test makes, and a system queue service of the test's own (one pretend
GPU, etc/kernel-queue/machine.json's rules) on a socket in a 0755 directory under /tmp. The hub
loads the recipe as TLJH loads a snippet (`load_subconfig`), with the test's settings beside it.

The users' servers run from "the hub's user environment": a virtual environment the test makes
under /tmp, on this environment's base Python where other users can run it, else on the
system's python3.X of the same version (a .venv made from pyenv's Python under /root, 0700, is
out of their reach), reading this environment's packages through a .pth file. A kernelspec is
installed into it with `jupyter kernel-queue install --sys-prefix`, as the README tells an admin.

Alice's kernel gets the GPU and runs cells as alice; bob's waits, and his server says so; when
alice shuts hers down, bob's starts and runs. Everything started (hub, proxy, servers, kernels,
the service) and the users with their homes are gone at the end, even on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from kernel_queue.machine import client
from tests import polling
from tests.conftest import skip_unless_ci
from tests.leftovers import SESSION_ENV
from tests.messages import run_cell
from tests.ports import free_port as _free_port

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "etc" / "jupyterhub" / "jupyterhub_config.py"
MACHINE_EXAMPLE = REPO / "etc" / "kernel-queue" / "machine.json"
SERVER_EXTENSION = REPO / "etc" / "jupyter" / "jupyter_server_config.d" / "kernel_queue.json"
PROXY = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
KERNEL = "python3-gpu-hub"
DISPLAY_NAME = "Python 3 (1 GPU, queued)"
WHO_AND_WHICH_GPU = "import getpass, os; (getpass.getuser(), os.environ['CUDA_VISIBLE_DEVICES'])"
T = TypeVar("T")


def until(check: Callable[[], Awaitable[T | None]], what: str, **options: Any) -> Awaitable[T]:
    """`polling.until` of an async check, typed (mypy cannot solve its T | Awaitable[T])."""
    return cast("Awaitable[T]", polling.until(cast(Any, check), what, **options))


def _namei(path: Path) -> str:
    done = subprocess.run(["namei", "-l", str(path)], capture_output=True, text=True, check=False)
    return " | ".join(line.strip() for line in done.stdout.splitlines())


def prerequisites() -> None:
    """Skip (fail under CI) with a sentence naming what this machine lacks."""
    if os.geteuid() != 0:
        skip_unless_ci("the JupyterHub recipe test needs root: it makes unix users with useradd")
    for tool in ("useradd", "userdel", "namei"):
        if shutil.which(tool) is None:
            skip_unless_ci(f"the JupyterHub recipe test needs {tool}, which is not installed")
    if importlib.util.find_spec("jupyterhub") is None:
        skip_unless_ci(
            "JupyterHub is not installed in this environment: install the dev extra "
            "(pip install -e '.[dev]', as scripts/env does)"
        )
    if shutil.which("node") is None:
        skip_unless_ci("configurable-http-proxy needs Node.js, which is not installed")
    npm = shutil.which("npm")
    if not PROXY.exists() and npm is not None:
        # package.json lists it as a devDependency: a node_modules made before it was added
        # lacks it. Install what the lockfile says, changing neither file.
        command = [npm, "install", "--no-audit", "--no-fund", "--no-save"]
        subprocess.run(command, cwd=REPO, capture_output=True, timeout=600, check=False)
    if not PROXY.exists():
        skip_unless_ci(
            f"configurable-http-proxy is not at {PROXY.relative_to(REPO)}: run `npm ci` in the "
            "checkout (package.json lists it as a devDependency)"
        )


class Users:
    """Unix users made for the test (`useradd -m`), removed with their homes by `remove`."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def add(self, who: str) -> str:
        name = f"kq-{who}-{uuid.uuid4().hex[:6]}"
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", name],
            capture_output=True,
            text=True,
            check=True,
        )
        self.names.append(name)
        return name

    def uids(self) -> set[int]:
        found = set()
        for name in self.names:
            with contextlib.suppress(KeyError):
                found.add(pwd.getpwnam(name).pw_uid)
        return found

    def processes(self) -> dict[int, str]:
        """pid -> command line of every process running as one of these users; not a zombie
        (one that has ended and waits for its parent to read its status: CI once found one,
        its command line already empty, in the moment after the hub stopped)."""
        uids, found = self.uids(), {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("State", "").split()[:1] == ["Z"]:
                continue
            if int(fields["Uid"].split()[0]) in uids:
                found[int(entry.name)] = cmdline.strip()
        return found

    def remove(self) -> list[str]:
        """Kill what still runs as them (by pid), then `userdel --remove`; what went wrong."""
        problems = []
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        for name in self.names:
            done = subprocess.run(
                ["userdel", "--remove", name], capture_output=True, text=True, check=False
            )
            with contextlib.suppress(KeyError):
                pwd.getpwnam(name)
                problems.append(f"userdel {name}: {done.stderr.strip()}")
            home = Path("/home") / name
            if home.exists():
                shutil.rmtree(home, ignore_errors=True)
                problems.append(f"{home} was left by userdel")
        return problems


def sockets_under(home: str) -> list[Path]:
    return [path for path in Path(home).rglob("*") if path.is_socket()]


def users_python(name: str) -> Path:
    """A Python of this version that user `name` can run: this environment's own base
    interpreter where others can reach it, else the system's."""
    entry = pwd.getpwnam(name)
    candidates = [
        Path(getattr(sys, "_base_executable", sys.executable)),
        Path(sys.base_prefix) / "bin" / VERSION,
        Path("/usr/bin") / VERSION,
        Path("/usr/local/bin") / VERSION,
    ]
    for candidate in candidates:
        if not candidate.exists():
            continue
        try:
            done = subprocess.run(
                [str(candidate), "-c", "import venv"],
                user=entry.pw_uid,
                group=entry.pw_gid,
                extra_groups=[],
                capture_output=True,
                check=False,
            )
        except PermissionError:
            continue  # in a directory they cannot enter
        if done.returncode == 0:
            return candidate
    base = Path(sys.base_prefix) / "bin" / VERSION
    skip_unless_ci(
        f"no {VERSION} here that another user can run: {base} is not reachable "
        f"({_namei(base)}), and there is no /usr/bin/{VERSION}; install Debian's {VERSION} "
        f"or put this environment's Python where every user can reach it"
    )
    raise AssertionError  # skip_unless_ci never returns


def users_environment(root: Path, name: str) -> Path:
    """The hub's user environment: a venv of a Python `name` can run that reads this
    environment's packages (a .pth file) and has the server extension's config file where
    pip's install of kernel-queue puts it, and a kernelspec installed with `--sys-prefix`."""
    environment = root / "env"
    python = users_python(name)
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(environment)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    site = environment / "lib" / VERSION / "site-packages"
    (site / "kernel_queue_test.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    config = environment / "etc" / "jupyter" / "jupyter_server_config.d"
    config.mkdir(parents=True)
    shutil.copy(SERVER_EXTENSION, config / SERVER_EXTENSION.name)
    entry = pwd.getpwnam(name)
    done = subprocess.run(
        [str(environment / "bin" / "python"), "-c", "import kernel_queue, jupyterhub"],
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        skip_unless_ci(
            f"{name} cannot import kernel-queue and JupyterHub from {ours} ({last}): make "
            f"that directory and {REPO} readable by every user ({_namei(ours)})"
        )
    install = "import sys; from kernel_queue.cli.app import main; main(sys.argv[1:])"
    subprocess.run(
        [
            *(str(environment / "bin" / "python"), "-c", install, "install", "--sys-prefix"),
            *("--name", KERNEL, "--display-name", DISPLAY_NAME, "--gpus", "1", "--queue", "gpu"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return environment


class Hub:
    """A JupyterHub process started with the recipe and the test's settings, and the calls a
    user's browser and the admin's scripts make through its proxy."""

    def __init__(self, root: Path, environment: Path, users: list[str], queue_socket: Path) -> None:
        self.root = root / "hub"
        self.root.mkdir()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = uuid.uuid4().hex
        self.password = uuid.uuid4().hex
        self.log = self.root / "hub.log"
        self.config = self.root / "jupyterhub_config.py"
        settings = {
            "JupyterHub.bind_url": self.url,
            "JupyterHub.hub_bind_url": f"http://127.0.0.1:{_free_port()}",
            "JupyterHub.db_url": f"sqlite:///{self.root / 'jupyterhub.sqlite'}",
            "JupyterHub.cookie_secret_file": str(self.root / "cookie_secret"),
            "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{_free_port()}",
            "ConfigurableHTTPProxy.command": [str(PROXY)],
            "ConfigurableHTTPProxy.auth_token": uuid.uuid4().hex,
            "JupyterHub.authenticator_class": "shared-password",
            "SharedPasswordAuthenticator.user_password": self.password,
            "Authenticator.allowed_users": users,
            "JupyterHub.spawner_class": "localprocess",
            "Spawner.cmd": [str(environment / "bin" / "python"), "-m", "jupyterhub.singleuser"],
            "Spawner.start_timeout": 120,
            "Spawner.http_timeout": 120,
            "JupyterHub.services": [{"name": "kq-test", "api_token": self.token}],
            "JupyterHub.load_roles": [
                {
                    "name": "kq-test",
                    "scopes": ["admin:users", "admin:servers", "tokens"],
                    "services": ["kq-test"],
                }
            ],
        }
        lines = ["c = get_config()  # noqa", f"load_subconfig({str(RECIPE)!r})"]
        lines += [f"c.{key} = {value!r}" for key, value in settings.items()]
        # The session's marker reaches the servers and kernels too (tests/leftovers.py).
        lines.append(f"c.Spawner.env_keep.append({SESSION_ENV!r})")
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("JUPYTER", "PYTEST")) and k != client.SOCKET_ENV
        }
        self.env[client.SYSTEM_SOCKET_ENV] = str(queue_socket)
        self.process: subprocess.Popen[bytes] | None = None
        self.proxy_pid = 0
        self.tokens: dict[str, str] = {}

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log, "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(self.config)],
                env=self.env,
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def start(self) -> None:
        """Start the hub; return once it answers through its proxy."""
        self.process = process = await asyncio.to_thread(self._spawn)

        async def answers() -> bool:
            assert process.poll() is None, f"the hub exited: {self.tail()}"
            try:
                response = await self.fetch("GET", "hub/api/", raise_error=False)
            except OSError:
                return False
            return bool(response.code == 200)

        await until(answers, "the hub answering through its proxy", every=0.25, detail=self.tail)
        self.proxy_pid = int((self.root / "jupyterhub-proxy.pid").read_text())

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.said()[-3000:]

    async def fetch(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        raise_error: bool = True,
        **options: Any,
    ) -> Any:
        headers = {"Authorization": f"token {token or self.token}", **options.pop("headers", {})}
        request = HTTPRequest(
            f"{self.url}/{path}",
            method=method,
            headers=headers,
            body=body if body is None or isinstance(body, str) else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=60,
            **options,
        )
        return await AsyncHTTPClient().fetch(request, raise_error=raise_error)

    async def api(self, method: str, path: str, body: Any = None, user: str = "") -> Any:
        """JSON from the hub's API (the test's token) or, with `user`, from that user's server
        (a token of theirs)."""
        token = self.tokens[user] if user else None
        prefix = f"user/{user}/" if user else "hub/api/"
        response = await self.fetch(method, prefix + path, body, token=token)
        return json.loads(response.body) if response.body else None

    async def entry(self, user: str, kernel_id: str, state: str) -> dict[str, Any]:
        """The kernel's entry in its server's queue listing once its state is `state`."""
        seen: list[Any] = []

        async def there() -> dict[str, Any] | None:
            seen[:] = await self.api("GET", "api/kernel-queue/kernels", user=user)
            found = next((k for k in seen if k["id"] == kernel_id), None)
            return found if found and (found["queue"] or {}).get("state") == state else None

        return await until(there, f"{user}'s kernel {state}", detail=lambda: seen)

    async def spawn(self, name: str) -> None:
        """Start `name`'s server as an admin's script does, and get a token of theirs."""
        made = await self.api("POST", f"users/{name}/tokens", {"note": "test", "expires_in": 900})
        self.tokens[name] = made["token"]
        await self.api("POST", f"users/{name}/server")

        async def ready() -> bool:
            model = await self.api("GET", f"users/{name}")
            return bool(model["servers"].get("", {}).get("ready"))

        await until(ready, f"{name}'s server ready", within=120, detail=self.tail)

    async def login(self, name: str, password: str) -> int:
        """POST the login form as a browser does; the status (302 in, 403 refused)."""
        page = await self.fetch("GET", "hub/login", raise_error=False)
        cookies = [c.split(";", 1)[0] for c in page.headers.get_list("Set-Cookie")]
        xsrf = next(c.split("=", 1)[1] for c in cookies if c.startswith("_xsrf="))
        response = await self.fetch(
            "POST",
            "hub/login",
            f"_xsrf={xsrf}&username={name}&password={password}",
            raise_error=False,
            follow_redirects=False,
            headers={"Cookie": "; ".join(cookies), "Authorization": ""},
        )
        return int(response.code)

    async def execute(self, user: str, kernel_id: str, code: str) -> dict[str, Any]:
        """Run `code` on the kernel's websocket through the proxy: execute_result, stream."""
        request = HTTPRequest(
            f"ws://127.0.0.1:{self.port}/user/{user}/api/kernels/{kernel_id}/channels",
            headers={"Authorization": f"token {self.tokens[user]}"},
        )
        ws = await websocket_connect(request)
        try:
            cell = await run_cell(ws, code, username=user)
        finally:
            ws.close()
        error = cell["ename"] and f"{cell['ename']}: {cell['evalue']}"
        return {"data": cell["data"], "stream": cell["stream"], "error": error}

    def stop(self) -> bool:
        """SIGTERM, as `systemctl stop jupyterhub`: the hub stops the users' servers (which shut
        their kernels down) and its proxy. Whether the proxy outlived it (then killed)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:  # still the proxy, not another process given its pid since
            alive = (
                b"configurable-http-proxy" in Path(f"/proc/{self.proxy_pid}/cmdline").read_bytes()
            )
        except OSError:
            return False
        if alive:
            os.kill(self.proxy_pid, signal.SIGKILL)
        return alive


@contextlib.contextmanager
def queue_service(root: Path) -> Iterator[tuple[Path, Any]]:
    """The machine's system service as the systemd unit runs it, from the example machine.json
    with one pretend GPU, on `root`/run/queue.sock; `start()` starts it (once), and it is
    stopped at the end."""
    settings = {**json.loads(MACHINE_EXAMPLE.read_text()), "gpus": 1, "pretend": True}
    config = root / "machine.json"
    config.write_text(json.dumps(settings))
    path = root / "run" / "queue.sock"
    log = root / "queue.log"
    started: list[subprocess.Popen[bytes]] = []

    def spawn() -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                [
                    *(sys.executable, "-m", "kernel_queue.machine", "--system"),
                    *("--config", str(config), "--socket", str(path)),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def start() -> None:
        service = await asyncio.to_thread(spawn)
        started.append(service)

        def answers() -> bool:
            assert service.poll() is None, f"the service exited: {log.read_text()}"
            return client._answers(path)

        await polling.until(answers, "the queue service answering")

    try:
        yield path, start
    finally:
        for service in started:
            if service.poll() is None:
                service.terminate()
                service.wait(timeout=30)


@contextlib.contextmanager
def traversable(*paths: Path) -> Iterator[None]:
    """Every folder above `paths` searchable by other users (o+x, never read) while the test
    runs, each mode as it was after: the hub users import kernel-queue from this checkout's
    environment, which CI clones under a private temporary folder (`mktemp -d`, 0700)."""
    changed: dict[Path, int] = {}
    for path in paths:
        for folder in path.parents:
            mode = folder.stat().st_mode
            if folder not in changed and not mode & stat.S_IXOTH:
                changed[folder] = stat.S_IMODE(mode)
    try:
        for folder, mode in changed.items():
            folder.chmod(mode | stat.S_IXOTH)
        yield
    finally:
        for folder, mode in changed.items():
            folder.chmod(mode)


@contextlib.contextmanager
def box() -> Iterator[tuple[Users, Path]]:
    """The machine's temp root (0755 under /tmp: a short socket path every user reaches) and
    its users; both gone at the end. This checkout and its environment are reachable by them
    meanwhile (`traversable`)."""
    root = Path(tempfile.mkdtemp(prefix="kq-hub-", dir="/tmp"))
    root.chmod(0o755)
    users = Users()
    purelib = Path(sysconfig.get_paths()["purelib"])
    try:
        with traversable(REPO / "pyproject.toml", purelib / "x"):
            yield users, root
    finally:
        problems = users.remove()
        shutil.rmtree(root, ignore_errors=True)
    assert not problems, problems  # only when the test passed: never hides its failure


async def test_two_hub_users_take_turns_on_the_machines_one_gpu() -> None:
    prerequisites()
    with box() as (users, root):
        alice, bob = users.add("alice"), users.add("bob")
        environment = users_environment(root, alice)
        with queue_service(root) as (queue_socket, start_service):
            hub = Hub(root, environment, [alice, bob], queue_socket)
            try:
                await hub.start()
                # No service answers yet: the hub's log says so, with the fix.
                assert f"kernel-queue: no queue service answers on {queue_socket}" in hub.said()
                assert await hub.login(alice, "not the password") == 403
                assert await hub.login(alice, hub.password) == 302
                await asyncio.gather(hub.spawn(alice), hub.spawn(bob))

                # Meanwhile a queued kernel fails, naming the socket; alice's server started
                # no private queue of its own (which would hand out the same GPUs again).
                early = await hub.api("POST", "api/kernels", {"name": KERNEL}, user=alice)
                failed = await hub.entry(alice, early["id"], "failed")
                assert failed["queue"]["failure"] == "launch"
                assert str(queue_socket) in failed["reason"]
                assert not await asyncio.to_thread(sockets_under, pwd.getpwnam(alice).pw_dir)
                assert not [c for c in users.processes().values() if "kernel_queue.machine" in c]
                await hub.api("DELETE", f"api/kernels/{early['id']}", user=alice)

                await start_service()
                first = await hub.api("POST", "api/kernels", {"name": KERNEL}, user=alice)
                ran = await hub.execute(alice, first["id"], WHO_AND_WHICH_GPU)
                assert (ran["error"], ran["data"]) == (None, repr((alice, "0")))

                second = await hub.api("POST", "api/kernels", {"name": KERNEL}, user=bob)
                waiting = await hub.entry(bob, second["id"], "queued")
                assert (waiting["queue"]["position"], waiting["queue"]["queue"]) == (1, "gpu")
                assert waiting["reason"] == "queued in 'gpu', position 1 of 1, needs 1 GPU"
                # The machine's queue, as bob's server shows it: alice holds the GPU (her
                # name, not her kernel's id), and his kernel is next.
                machine = await hub.api("GET", "api/kernel-queue/machine", user=bob)
                assert machine["service"]["system"] is True
                assert (machine["gpus"], machine["gpus_in_use"]) == (["0"], 1)
                seen = {k["user"]: k for k in machine["kernels"]}
                assert set(seen) == {alice, bob}
                assert (seen[alice]["state"], seen[alice]["devices"]) == ("admitted", ["0"])
                assert seen[alice]["kernel_id"] == ""
                assert (seen[bob]["state"], seen[bob]["position"]) == ("queued", 1)
                assert (seen[bob]["kernel_id"], seen[bob]["here"]) == (second["id"], True)

                await hub.api("DELETE", f"api/kernels/{first['id']}", user=alice)
                ran = await hub.execute(bob, second["id"], WHO_AND_WHICH_GPU)
                assert (ran["error"], ran["data"]) == (None, repr((bob, "0")))
                running = await hub.entry(bob, second["id"], "running")
                assert running["queue"]["devices"] == ["0"]
            finally:
                proxy_outlived_hub = hub.stop()
            assert hub.process is not None and hub.process.returncode == 0, hub.tail()
            assert not proxy_outlived_hub, "the hub left its proxy running"
            assert not users.processes(), f"left running: {users.processes()}"
