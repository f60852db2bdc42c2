"""GPU check: what kernel-queue promises about GPUs, through a real Jupyter server and kernels.

Run it on any machine; on one without an NVIDIA GPU the GPU-only checks print SKIP with the
reason and the rest run on pretend GPUs and CPU tensors. Each check prints one line, PASS, FAIL or
SKIP, with its figures; the exit status is 1 if any check FAILED. No check is timed: the speeds
are figures beside their baselines (min / median / max of `--repeat` runs), not assertions.

The checks, in order:
  detect      the local backend's GPU detection (NVML, then `nvidia-smi -L`) against an
              independent look (pynvml if installed, else `nvidia-smi`): the same GPUs, or none
  inventory   a `jupyter server` with the kernel_queue extension (the local backend; kernelspecs
              written by `jupyter kernel-queue install`) offers those GPUs, or `--pretend-gpus`
  isolation   each of G one-GPU kernels (G = the server's GPUs) gets its own
              CUDA_VISIBLE_DEVICES and one more waits in the queue until a GPU is free
  isolation-cuda   (GPU) each kernel's torch sees one device, the UUID of the GPU it was given,
              and NVML lists the kernel's process on that GPU only
  preemption  a kernel holding every GPU with `--size-gib` GiB of torch tensors (CUDA, one per
              visible device in turn; CPU without a GPU) is preempted by a higher-priority
              kernel, saves, waits, and comes back with equal bytes on the same devices
  park        the same kernel parked (`POST /api/kernel-queue/kernels/<id>/park`): its launcher
              and kernel processes end; its next cell wakes it with equal bytes
  park-gpu-freed   (GPU) after the park NVML lists no process of the kernel and the GPUs' used
              memory falls by the tensors' size
  speed       in that kernel: kernel_queue.checkpoint save / restore (fsync, digests, signature)
              against torch.save + fsync / torch.load of the same tensors, in GB/s
Usage: python benchmarks/gpu_check.py [--size-gib G] [--repeat 3] [--json OUT] [--pretend-gpus 2]
       (G: 4 with a GPU, 0.25 without)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from kernel_queue.backends.local import gpus as gpu_detection

JUPYTER = str(Path(sys.executable).parent / "jupyter")
MARK = "KQ-GPU-CHECK "
HAS_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = (
    f"torch is not installed for {sys.executable} (kernels run it): "
    "`pip install torch` (CPU only: --index-url https://download.pytorch.org/whl/cpu)"
)

# What a cell prints: its process, its CUDA_VISIBLE_DEVICES and, with CUDA, what torch sees
# (a tensor on each device makes a context, so that NVML lists the process).
PROBE = """
import json as _json, os as _os
_seen = {"pid": _os.getpid(), "cvd": _os.environ.get("CUDA_VISIBLE_DEVICES")}
try:
    import torch as _torch
    if _torch.cuda.is_available():
        _seen["uuids"] = [str(_torch.cuda.get_device_properties(i).uuid)
                          for i in range(_torch.cuda.device_count())]
        _held = [_torch.ones(1, device=f"cuda:{i}") for i in range(_torch.cuda.device_count())]
except ImportError:
    pass
print(@MARK@ + _json.dumps(_seen))
"""

# A notebook's tensors: `count` of them, round-robin over the visible CUDA devices (else the CPU),
# and a second name bound to the first.
TENSORS = """
import torch
devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
for _i in range(@COUNT@):
    _device = devices[_i % len(devices)]
    _gen = torch.Generator(device=_device).manual_seed(_i)
    globals()[f"t{_i}"] = torch.rand(@NUMEL@, device=_device, generator=_gen)
alias = t0
del _i, _device, _gen
"""

# The tensors' fingerprint (device, dtype, shape, sha256 of the bytes) and the kernel's processes.
STATE = """
def _kq_state():
    import hashlib, json, os, torch
    ns = globals()
    seen = {"pid": os.getpid(), "ppid": os.getppid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "alias": ns.get("alias") is ns.get("t0") is not None, "tensors": {}}
    for name in sorted(k for k in ns if k[:1] == "t" and k[1:].isdigit()):
        t = ns[name]
        data = t.detach().to("cpu").contiguous().view(torch.uint8).numpy()
        seen["tensors"][name] = {"device": str(t.device), "dtype": str(t.dtype),
                                 "shape": list(t.shape), "sha256": hashlib.sha256(data).hexdigest()}
    return seen
print(@MARK@ + __import__("json").dumps(_kq_state()))
del _kq_state
"""

# Save and restore of the kernel's tensors, ours against torch's, alternating who goes first,
# after one untimed round.
SPEED = """
def _kq_speed(root, repeat):
    import json, os, shutil, time, types, torch
    import kernel_queue.checkpoint as kc
    ns = globals()
    names = sorted(k for k in ns if k[:1] == "t" and k[1:].isdigit())
    module = types.ModuleType("bench")
    for name in names:
        setattr(module, name, ns[name])
    total = sum(ns[n].numel() * ns[n].element_size() for n in names)
    secret = kc.derive_secret(b"gpu check")
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = {"ours save": [], "ours restore": [], "torch.save": [], "torch.load": []}
    same = True

    def ours(path):
        started = time.perf_counter()
        report = kc.save(module, kc.DirectoryStore(path, secret=secret))
        times["ours save"].append(time.perf_counter() - started)
        assert report.checkpoint is not None, kc.summary(report)
        into = types.ModuleType("bench")
        started = time.perf_counter()
        recovery = kc.recover(into, kc.DirectoryStore(path, secret=secret))
        sync()
        times["ours restore"].append(time.perf_counter() - started)
        assert recovery.report is not None, kc.summary(recovery)
        return {n: getattr(into, n) for n in names}

    def theirs(path):
        os.makedirs(path)
        started = time.perf_counter()
        with open(os.path.join(path, "tensors.pt"), "wb") as file:
            torch.save({n: ns[n] for n in names}, file)
            file.flush()
            os.fsync(file.fileno())
        times["torch.save"].append(time.perf_counter() - started)
        started = time.perf_counter()
        loaded = torch.load(os.path.join(path, "tensors.pt"))
        sync()
        times["torch.load"].append(time.perf_counter() - started)
        return loaded

    for run in range(repeat + 1):  # run 0 warms up (and outlasts a background save): not kept
        order = [ours, theirs] if run % 2 else [theirs, ours]
        for step in order:
            path = os.path.join(root, f"{step.__name__}-{run}")
            back = step(path)
            same = same and all(back[n].device == ns[n].device and torch.equal(back[n], ns[n])
                                for n in names)
            del back
            shutil.rmtree(path)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return {"bytes": total, "times": {k: v[1:] for k, v in times.items()}, "equal": same}
print(@MARK@ + __import__("json").dumps(_kq_speed(@ROOT@, @REPEAT@)))
del _kq_speed
"""


def code(template: str, **values: Any) -> str:
    """A cell from `template`: each @KEY@ replaced by repr(value), @MARK@ by MARK's."""
    for key, value in {"MARK": MARK, **values}.items():
        template = template.replace(f"@{key}@", repr(value))
    return template


class Checks:
    """The lines printed, and what `--json` writes."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def say(self, status: str, name: str, text: str, **figures: Any) -> None:
        print(f"{status:4} {name}: {text}", flush=True)
        self.results.append({"check": name, "status": status, "text": text, "figures": figures})

    def failed(self) -> bool:
        return any(r["status"] == "FAIL" for r in self.results)


# --- the NVIDIA driver, looked at independently of the product ---------------------------------


def nvml_gpus() -> tuple[list[tuple[str, str]], str]:
    """(index, uuid) of each GPU by pynvml, else `nvidia-smi`; and how they were found."""
    if importlib.util.find_spec("pynvml") is not None:
        import pynvml  # type: ignore[import-not-found]

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            return [], f"pynvml: {error}"
        try:
            found = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                found.append((str(index), _text(pynvml.nvmlDeviceGetUUID(handle))))
            return found, "pynvml"
        finally:
            pynvml.nvmlShutdown()
    rows = _smi("--query-gpu=index,uuid")
    if rows is None:
        return [], "no pynvml, no nvidia-smi"
    return [(row[0], row[1]) for row in rows], "nvidia-smi"


def gpu_processes() -> tuple[dict[int, set[str]], dict[str, int]] | None:
    """NVML's compute processes (pid -> GPU uuids) and each GPU's used memory (uuid -> MiB);
    None where neither pynvml nor nvidia-smi answers."""
    if importlib.util.find_spec("pynvml") is not None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        try:
            pids: dict[int, set[str]] = {}
            used: dict[str, int] = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                gpu = _text(pynvml.nvmlDeviceGetUUID(handle))
                used[gpu] = pynvml.nvmlDeviceGetMemoryInfo(handle).used >> 20
                for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    pids.setdefault(int(process.pid), set()).add(gpu)
            return pids, used
        finally:
            pynvml.nvmlShutdown()
    apps = _smi("--query-compute-apps=pid,gpu_uuid")
    memory = _smi("--query-gpu=uuid,memory.used")
    if apps is None or memory is None:
        return None
    pids = {}
    for pid, gpu in apps:
        pids.setdefault(int(pid), set()).add(gpu)
    return pids, {gpu: int(mib) for gpu, mib in memory}


def _smi(query: str) -> list[list[str]] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[f.strip() for f in line.split(",")] for line in done.stdout.splitlines() if line]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _uuid(value: str) -> str:
    """A GPU UUID as NVML ('GPU-…') and torch ('…') spell it, compared alike."""
    return value.lower().removeprefix("gpu-")


def nvml_loads() -> str:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as error:
        return f"libnvidia-ml.so.1 does not load ({error})"
    return "libnvidia-ml.so.1 loads"


# --- a real Jupyter server, driven over REST and the kernel websocket ---------------------------


class Server:
    """One `jupyter server` process with the kernel_queue extension, in its own directories."""

    def __init__(self, root: Path, pretend_gpus: int) -> None:
        self.root = root
        self.token = uuid.uuid4().hex
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        # Short: the machine queue's socket lies in the runtime dir.
        self.runtime = Path(tempfile.mkdtemp(prefix="kq-gpu-", dir="/tmp"))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
        self.env.update(
            JUPYTER_DATA_DIR=str(root / "data"),
            JUPYTER_CONFIG_DIR=str(root / "config"),
            JUPYTER_RUNTIME_DIR=str(self.runtime),
            JUPYTER_PLATFORM_DIRS="1",
        )
        (root / "config").mkdir(parents=True)
        (root / "notebooks").mkdir()
        config = {
            "ServerApp": {  # ours only: the lab's extensions add seconds to the start
                "jpserver_extensions": {
                    "kernel_queue": True,
                    **dict.fromkeys(("jupyterlab", "jupyter_lsp", "notebook_shim"), False),
                }
            },
            "LocalBackend": {"pretend_gpus": pretend_gpus},
        }
        (root / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
        self.process: subprocess.Popen[bytes] | None = None

    def install(self, name: str, *options: str) -> None:
        """`jupyter kernel-queue install --user --name NAME OPTIONS`, as a user would."""
        subprocess.run(
            [JUPYTER, "kernel-queue", "install", "--user", f"--name={name}", *options],
            env=self.env,
            check=True,
            capture_output=True,
        )

    async def start(self) -> None:
        argv = [
            *(sys.executable, "-m", "jupyter_server", "--no-browser"),
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root / 'notebooks'}",
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ]
        self.process = await asyncio.to_thread(self._spawn, argv)

        async def answers() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.tail()}")
            try:
                await self.call("GET", "api/status")
            except (OSError, RuntimeError):
                return False
            return True

        await until(answers, "the server answering", within=120)

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.log, "wb") as out:
            return subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.root
            )

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            f"{self.base}/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=120,
        )
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
        if response.code >= 400:
            raise RuntimeError(f"{method} /{path}: {response.code} {response.body[:500]!r}")
        return json.loads(response.body) if response.body else None

    async def kernel(self, name: str) -> str:
        return str((await self.call("POST", "api/kernels", {"name": name}))["id"])

    async def reason(self, kernel_id: str) -> str:
        return str((await self.call("GET", f"api/kernels/{kernel_id}")).get("reason", ""))

    async def says(self, kernel_id: str, text: str, within: float = 300) -> str:
        """Wait until the kernel's reason contains `text`; return the reason."""
        seen = [""]

        async def check() -> bool:
            seen[0] = await self.reason(kernel_id)
            return text in seen[0]

        await until(check, f"kernel {kernel_id[:8]}'s reason to say {text!r}", within, seen)
        return seen[0]

    async def cell(self, kernel_id: str, code: str, within: float = 600) -> dict[str, Any]:
        """Run `code` on the kernel's websocket as a notebook does: the JSON it printed after
        MARK (`seen`), its other output (`stream`), its error, and the seconds it took."""
        url = self.base.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(
            HTTPRequest(url, headers={"Authorization": f"token {self.token}"})
        )
        header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "version": "5.3"}
        header |= {"session": uuid.uuid4().hex, "username": "gpu-check", "date": ""}
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
        content |= {"allow_stdin": False, "stop_on_error": True}
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
        result: dict[str, Any] = {"seen": None, "stream": "", "error": None}
        started = time.perf_counter()
        try:
            async with asyncio.timeout(within):
                await ws.write_message(json.dumps({**message, "channel": "shell", "buffers": []}))
                while True:
                    raw = await ws.read_message()
                    if raw is None:
                        raise RuntimeError(f"the websocket closed; the cell had {result}")
                    reply = json.loads(raw)
                    if reply.get("parent_header", {}).get("msg_id") != header["msg_id"]:
                        continue
                    kind, body = reply["msg_type"], reply["content"]
                    if kind == "stream":
                        for line in body["text"].splitlines(keepends=True):
                            if line.startswith(MARK):
                                result["seen"] = json.loads(line[len(MARK) :])
                            else:
                                result["stream"] += line
                    elif kind == "error":
                        result["error"] = f"{body['ename']}: {body['evalue']}"
                    elif kind == "status" and body["execution_state"] == "idle":
                        break
        except TimeoutError:
            reason = await self.reason(kernel_id)
            raise RuntimeError(
                f"a cell did not finish within {within} s (the kernel: {reason!r})"
            ) from None
        finally:
            ws.close()
        result["seconds"] = time.perf_counter() - started
        if result["error"]:
            raise RuntimeError(f"the cell failed: {result['error']}\n{result['stream']}")
        return result

    async def shutdown_all(self) -> None:
        for kernel in await self.call("GET", "api/kernels"):
            with contextlib.suppress(RuntimeError):  # already gone
                await self.call("DELETE", f"api/kernels/{kernel['id']}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # as ^C: it shuts its kernels down
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.runtime, ignore_errors=True)


async def until(
    check: Callable[[], Awaitable[bool]], what: str, within: float, seen: Any = None
) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no {what} within {within:.0f} s" + (f" (saw {seen})" if seen else "")
            )
        await asyncio.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


# --- the checks ---------------------------------------------------------------------------------


def check_detect(checks: Checks) -> list[gpu_detection.Gpu]:
    found = gpu_detection.detect()
    independent, how = nvml_gpus()
    ours = [(g.index, _uuid(g.uuid)) for g in found]
    theirs = [(index, _uuid(gpu)) for index, gpu in independent]
    if not found and not independent:
        checks.say(
            "PASS",
            "detect",
            f"no NVIDIA GPU: NVML found none ({nvml_loads()}; {how}), and the local backend "
            "detects none",
            gpus=0,
        )
    elif ours == theirs:
        names = ", ".join(f"{g.index} {g.name}" for g in found)
        checks.say(
            "PASS", "detect", f"{len(found)} GPU(s) [{names}], as {how} lists them", gpus=len(found)
        )
    else:
        checks.say("FAIL", "detect", f"the local backend detects {ours}, {how} lists {theirs}")
    return found


async def check_inventory(checks: Checks, server: Server, found: list[Any], pretend: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    expected = (
        len([d for d in visible.split(",") if d.strip()])
        if visible is not None
        else len(found) or pretend
    )
    log = server.tail(100_000)
    line = next((x for x in log.splitlines() if "kernel-queue local backend:" in x), "")
    said = line.split("kernel-queue local backend:", 1)[-1].strip()
    if not said:  # the backend says its inventory when the first kernel needs it
        checks.say("SKIP", "inventory", "the server did not log its GPU inventory yet")
        return expected
    gpus = int(said.split()[0])
    kind = "pretend " if "pretend" in said else ""
    if gpus == expected:
        checks.say("PASS", "inventory", f"the server's local backend has {said}", gpus=gpus)
    else:
        checks.say("FAIL", "inventory", f"the server says {said!r}; expected {expected} {kind}GPUs")
    return gpus


async def check_isolation(
    checks: Checks, server: Server, found: list[gpu_detection.Gpu], count: int, torch_ok: bool
) -> None:
    """`count` one-GPU kernels each get their own GPU; one more waits until one leaves."""
    kernels = [await server.kernel("one") for _ in range(count)]
    seen = [(await server.cell(k, code(PROBE)))["seen"] for k in kernels]
    extra = await server.kernel("one")
    waiting = await server.says(extra, "position 1 of 1")
    cuda = [s.get("uuids") for s in seen]
    processes = gpu_processes() if found else None
    await server.call("DELETE", f"api/kernels/{kernels[0]}")
    late = (await server.cell(extra, code(PROBE)))["seen"]
    given = [s["cvd"] for s in seen]
    problems = []
    if len(set(given)) != count or any(g is None or "," in g for g in given):
        problems.append(f"the kernels were given {given}, not one GPU each")
    if late["cvd"] != given[0]:
        problems.append(f"the late kernel got {late['cvd']!r}, not the freed {given[0]!r}")
    text = (
        f"{count} kernel{'s' * (count > 1)} saw CUDA_VISIBLE_DEVICES {', '.join(map(str, given))}; "
        "one more waited "
        f"({waiting!r}) and got {late['cvd']} once kernel 1 left"
    )
    checks.say(
        "FAIL" if problems else "PASS",
        "isolation",
        "; ".join(problems) or text,
        given=given,
        late=late["cvd"],
    )

    if not found:
        checks.say("SKIP", "isolation-cuda", "no NVIDIA GPU: NVML found none")
    elif not torch_ok:
        checks.say("SKIP", "isolation-cuda", NO_TORCH)
    else:
        by_index = {g.index: _uuid(g.uuid) for g in found}
        problems = []
        for number, (one, uuids) in enumerate(zip(seen, cuda, strict=True), 1):
            want = by_index.get(str(one["cvd"]))
            if uuids is None:
                problems.append(f"kernel {number}: torch sees no CUDA device")
            elif [_uuid(u) for u in uuids] != [want]:
                problems.append(f"kernel {number} given {one['cvd']} ({want}) sees {uuids}")
            if processes is not None and one["pid"] in processes[0]:
                on = {_uuid(u) for u in processes[0][one["pid"]]}
                if on != {want}:
                    problems.append(f"NVML lists kernel {number} on {on}, not only on {want}")
        listed = processes is not None and all(s["pid"] in processes[0] for s in seen)
        nvml = (
            "NVML lists each on its GPU only"
            if listed
            else (
                "NVML does not list the kernels' pids (another pid namespace?): torch's view only"
            )
        )
        checks.say(
            "FAIL" if problems else "PASS",
            "isolation-cuda",
            "; ".join(problems) or f"each kernel's torch sees 1 device, its own UUID; {nvml}",
        )
    for kernel in [*kernels[1:], extra]:
        await server.call("DELETE", f"api/kernels/{kernel}")


async def nvml_after_park(
    held: tuple[dict[int, set[str]], dict[str, int]] | None, pid: int, total: int
) -> tuple[dict[int, set[str]], dict[str, int]] | None:
    """NVML's view once the parked kernel's process is gone from it and the GPUs' used memory
    fell by 90 % of the tensors' size, or as it is after 10 s (the driver frees a context
    moments after its process ends)."""
    deadline = time.monotonic() + 10
    while True:
        now = gpu_processes()
        if held is None or now is None or time.monotonic() > deadline:
            return now
        drop = sum(held[1].values()) - sum(now[1].values())
        if pid not in now[0] and drop >= 0.9 * total / 2**20:
            return now
        await asyncio.sleep(0.2)


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two STATE fingerprints of the tensors."""
    problems = []
    if before["tensors"].keys() != after["tensors"].keys():
        problems.append(f"names {sorted(before['tensors'])} became {sorted(after['tensors'])}")
    for name, was in before["tensors"].items():
        now = after["tensors"].get(name)
        if now is None:
            continue
        for key in ("device", "dtype", "shape", "sha256"):
            if was[key] != now[key]:
                problems.append(f"{name}'s {key} {was[key]} became {now[key]}")
    if not after["alias"]:
        problems.append("alias is no longer t0")
    return problems


async def check_preemption_park_speed(
    checks: Checks, server: Server, args: argparse.Namespace, found: list[Any]
) -> None:
    total = int(args.size_gib * 2**30)
    count = 4
    numel = total // 4 // count
    low = await server.kernel("low")
    made = await server.cell(low, code(TENSORS, COUNT=count, NUMEL=numel))
    before = (await server.cell(low, code(STATE)))["seen"]
    devices = sorted({t["device"] for t in before["tensors"].values()})
    what = f"{count} float32 tensors, {count * numel * 4 / 2**30:.2f} GiB on {', '.join(devices)}"

    # Preemption: a higher-priority kernel that needs a GPU while `low` holds them all.
    high = await server.kernel("high")
    preempted = await server.says(low, "requeued")
    await server.cell(high, "1")
    await server.call("DELETE", f"api/kernels/{high}")
    back = await server.cell(low, code(STATE))  # queued until the GPUs are free, then restored
    after = back["seen"]
    restored = " ".join(back["stream"].split())
    problems = compare(before, after)
    if after["pid"] == before["pid"]:
        problems.append("the kernel's process did not change: it was not preempted")
    kind = "CUDA" if "cuda" in " ".join(devices) else "CPU (no CUDA)"
    checks.say(
        "FAIL" if problems else "PASS",
        "preemption",
        "; ".join(problems)
        or (
            f"{kind} tensors: {what} (made in {made['seconds']:.1f} s); preempted by a "
            f"higher-priority kernel ({preempted!r}); back with equal bytes on the same devices "
            f"(CUDA_VISIBLE_DEVICES {before['cvd']} -> {after['cvd']}): {restored!r}"
        ),
        bytes=count * numel * 4,
        devices=devices,
        preempted=preempted,
        restored=restored,
    )

    # Park: the kernel's processes end (so its GPU memory can only be free), and it comes back.
    held = gpu_processes() if found else None
    parked_at = time.perf_counter()
    await server.call("POST", f"api/kernel-queue/kernels/{low}/park")
    parked = await server.says(low, "released; your next cell")
    parked_s = time.perf_counter() - parked_at
    alive = [pid for pid in (after["pid"], after["ppid"]) if _alive(pid)]
    freed = await nvml_after_park(held, after["pid"], total) if found else None
    woken = await server.cell(low, code(STATE))  # the next cell wakes it
    problems = compare(before, woken["seen"])
    if alive:
        problems.append(f"processes {alive} (kernel, launcher) still run after the park")
    checks.say(
        "FAIL" if problems else "PASS",
        "park",
        "; ".join(problems)
        or (
            f"parked in {parked_s:.1f} s ({parked!r}); kernel pid {after['pid']} and launcher "
            f"pid {after['ppid']} ended; the next cell woke it in {woken['seconds']:.1f} s with "
            "equal bytes on the same devices"
        ),
        park_seconds=parked_s,
        wake_seconds=woken["seconds"],
    )
    if not found:
        checks.say("SKIP", "park-gpu-freed", "no NVIDIA GPU: NVML found none")
    elif "cuda" not in " ".join(devices):
        checks.say("SKIP", "park-gpu-freed", "the kernel's torch has no CUDA: nothing on the GPU")
    elif held is None or freed is None:
        checks.say("SKIP", "park-gpu-freed", "neither pynvml nor nvidia-smi answers")
    else:
        pid = after["pid"]
        drop = sum(held[1].values()) - sum(freed[1].values())
        problems = []
        if pid in freed[0]:
            problems.append(f"NVML still lists the parked kernel's pid {pid} on {freed[0][pid]}")
        if drop < 0.9 * total / 2**20:
            problems.append(f"the GPUs' used memory fell by {drop} MiB only")
        listed = (
            "NVML listed its pid before, none after"
            if pid in held[0]
            else ("NVML never listed its pid (another pid namespace?)")
        )
        checks.say(
            "FAIL" if problems else "PASS",
            "park-gpu-freed",
            "; ".join(problems) or f"{listed}; used memory fell by {drop} MiB",
            freed_mib=drop,
        )

    # Speed: ours against torch.save / torch.load, in the kernel, on the same tensors.
    scratch = server.root / "speed"
    scratch.mkdir()
    speed = (await server.cell(low, code(SPEED, ROOT=str(scratch), REPEAT=args.repeat)))["seen"]
    size = speed["bytes"] / 1e9
    rates = {k: [size / s for s in v] for k, v in speed["times"].items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    text = (
        f"{size:.2f} GB, GB/s min / median / max of {args.repeat}: save ours "
        f"{spread(rates['ours save'])} vs torch.save+fsync {spread(rates['torch.save'])} "
        f"({med['ours save'] / med['torch.save']:.2f}x); restore ours "
        f"{spread(rates['ours restore'])} vs torch.load {spread(rates['torch.load'])} "
        f"({med['ours restore'] / med['torch.load']:.2f}x)"
    )
    load = os.getloadavg()[0]
    text += f"; load average {load:.1f} on {os.cpu_count()} cores"
    if not speed["equal"]:
        checks.say("FAIL", "speed", "a restore or torch.load gave other bytes or devices; " + text)
    else:
        checks.say("PASS", "speed", text, gb=size, gb_per_s=rates)
    await server.call("DELETE", f"api/kernels/{low}")


async def run(args: argparse.Namespace, checks: Checks, root: Path) -> None:
    found = check_detect(checks)
    if args.size_gib is None:
        args.size_gib = 4.0 if found else 0.25
    torch = f"torch {importlib.metadata.version('torch')}" if HAS_TORCH else "no torch"
    print(f"     {torch} for {sys.executable}; {os.cpu_count()} cores", flush=True)
    server = Server(root, args.pretend_gpus)
    try:
        server.install("one", "--gpus=1", "--queue=gpu")
        started = time.perf_counter()
        await server.start()
        first = await server.kernel("one")  # the backend finds its GPUs for the first kernel
        await server.cell(first, "1")
        await server.call("DELETE", f"api/kernels/{first}")
        took = time.perf_counter() - started
        print(f"     (a jupyter server and its first kernel in {took:.1f} s)", flush=True)
        gpus = await check_inventory(checks, server, found, args.pretend_gpus)
        server.install("high", "--gpus=1", "--queue=gpu", "--priority-class=high")
        server.install(  # every GPU, checkpoints on
            "low",
            *(f"--gpus={gpus}", "--queue=gpu", "--priority-class=low"),
            *("--checkpoint", "--grace-seconds=300"),
        )

        async def isolation() -> None:
            await check_isolation(checks, server, found, gpus, HAS_TORCH)

        async def tensors() -> None:
            await check_preemption_park_speed(checks, server, args, found)

        steps: list[tuple[tuple[str, ...], Callable[[], Awaitable[None]]]] = [
            (("isolation", "isolation-cuda"), isolation),
            (("preemption", "park", "park-gpu-freed", "speed"), tensors),
        ]
        for names, step in steps:
            if not HAS_TORCH and step is tensors:
                for name in names:
                    checks.say("SKIP", name, NO_TORCH)
                continue
            try:
                await step()
            except Exception as error:  # a check that could not finish is a FAIL, said so
                done = {r["check"] for r in checks.results}
                name = next((n for n in names if n not in done), names[-1])
                checks.say("FAIL", name, f"{type(error).__name__}: {error}")
                print(f"the server's log ends:\n{server.tail()}", file=sys.stderr)
                await server.shutdown_all()
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-gib",
        type=float,
        default=None,
        help="GiB of tensors (default 4 with a GPU, 0.25 without)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each save and restore")
    parser.add_argument("--json", default=None, help="write the lines and figures here")
    parser.add_argument(
        "--pretend-gpus",
        type=int,
        default=2,
        help="GPUs the server pretends to have where it finds none",
    )
    args = parser.parse_args()
    checks = Checks()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kq-gpu-check-") as tmp:
        asyncio.run(run(args, checks, Path(tmp)))
    seconds = time.perf_counter() - started
    counts = {s: sum(r["status"] == s for r in checks.results) for s in ("PASS", "FAIL", "SKIP")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()) + f" in {seconds:.0f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"seconds": seconds, "size_gib": args.size_gib, "checks": checks.results}, indent=2
            )
        )
    return 1 if checks.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
