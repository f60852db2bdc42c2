"""`KueueProcessProxy` on the scripted `FakeBackend`, under a stand-in for EG's kernel manager:
launch, a restart in place handed to the next proxy, kill and release, a bad kernelspec and a
client that stops waiting. Run with Enterprise Gateway's python (`.venv-eg`, which has no
pytest) by test_proxy_session.py; it starts no process. Exits non-zero on a failed check."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from jupyter_client.kernelspec import KernelSpec
from tornado import web
from traitlets.config import Configurable, LoggingConfigurable

from kernel_queue.backends.fake import FakeBackend
from kernel_queue.gateway.proxy import KueueProcessProxy, _releases

KERNEL = "5a0d1c2b-7e4f-4a3b-8c9d-0e1f2a3b4c5d"


class Owner(Configurable):
    """EG's mapping kernel manager: what shares the backends."""


class Keys:
    key = b"eg-key"


class Manager(LoggingConfigurable):
    """The parts of EG's RemoteKernelManager a process proxy touches."""

    def __init__(self, owner: Owner, **config: Any) -> None:
        super().__init__(parent=owner)
        self.kernel_id = KERNEL
        self.kernel_name = "fake"
        self.port_range = "0..0"
        self.impersonation_enabled = False
        self.unauthorized_users: set[str] = set()
        self.authorized_users: set[str] = set()
        self.session = Keys()
        self.last_activity: Any = None
        self.connection: dict[str, Any] = {}
        self.process_proxy: Any = None
        settings = {"backend": "local", "queue": "gpu", "gpus": 1, **config}
        self.kernel_spec = KernelSpec(
            argv=["python", "-f", "{connection_file}"],
            display_name="fake",
            language="python",
            metadata={"kernel_provisioner": {"config": settings}},
        )

    def request_shutdown(self, restart: bool = False) -> None:
        """Sends `shutdown_request` to the kernel in EG; the proxy is told after."""

    def load_connection_info(self, info: dict[str, Any]) -> None:
        self.connection = info


async def launched(proxy: KueueProcessProxy, **env: str) -> None:
    await proxy.launch_process("kernel", env={"KERNEL_USERNAME": "alice", **env})


async def soon(check: Any) -> None:
    """Let other tasks run until `check` holds (bounded)."""
    async with asyncio.timeout(5):
        while not check():  # noqa: ASYNC110 - each turn lets the proxy's tasks take a step
            await asyncio.sleep(0)


async def launch_restart_in_place_and_kill() -> None:
    owner = Owner()
    fake = FakeBackend().serve(owner)
    km = Manager(owner)
    proxy = km.process_proxy = KueueProcessProxy(km, {})
    launch = asyncio.ensure_future(launched(proxy))
    await soon(lambda: KERNEL in fake.groups)
    assert proxy.poll() is None  # queued: alive
    assert km.last_activity is not None  # the culler leaves a waiting kernel alone
    fake.admit(KERNEL)
    fake.run(KERNEL)
    await launch
    assert km.connection["key"] == "eg-key" and km.connection["hb_port"] == 40004
    assert proxy.get_process_info()["kernel_queue"]["group"]["kernel_id"] == KERNEL

    km.request_shutdown(restart=True)  # EG's restart: the pod (here: launcher) stays
    assert proxy.poll() is None
    fake.kernel_exits(KERNEL)
    await soon(lambda: proxy.poll() == 0)
    proxy.cleanup()
    assert _releases[KERNEL][2], "the session restarts in place"
    again = km.process_proxy = KueueProcessProxy(km, {})  # EG's new proxy for the new launch
    fake.kernel_starts(KERNEL)
    await launched(again)
    await asyncio.sleep(0)  # the cancelled release would run now
    assert len(fake.submitted) == 1 and fake.released == [], "kept the admission"
    assert again.poll() is None

    again.kill()
    assert again.poll() is None  # kill's release is under way
    assert again._ending is not None
    await again._ending
    assert again.poll() == -signal.SIGKILL
    assert len(fake.released) == 1, fake.released
    assert fake.closed, "the last kernel let go of EG's backends"


async def refused(config: dict[str, Any], status: int, **env: str) -> tuple[FakeBackend, str]:
    """Launch with this kernelspec config and env, which must fail with HTTP `status`; the fake
    backend and the error's message."""
    owner = Owner()
    fake = FakeBackend().serve(owner)
    proxy = KueueProcessProxy(Manager(owner, **config), {})
    try:
        await launched(proxy, **env)
    except web.HTTPError as exc:
        assert exc.status_code == status, exc
        return fake, str(exc.log_message)
    raise AssertionError("the launch did not fail")


async def a_bad_kernelspec_is_an_http_error_naming_the_fix() -> None:
    fake, said = await refused({"gpu": 1}, 500)
    assert "unknown config key `gpu` (did you mean `gpus`?)" in said
    assert fake.submitted == []


async def park_after_is_refused_naming_the_key_and_the_way_out() -> None:
    checkpoint = {"enabled": True, "path": "/tmp/kernel-queue-eg-checkpoints"}
    fake, said = await refused({"park_after": 600, "checkpoint": checkpoint}, 500)
    assert "kernelspec 'fake': `park_after` is 600, but Enterprise Gateway 3.x cannot park" in said
    assert "set `park_after` to 0" in said
    assert fake.submitted == []


async def a_client_that_stops_waiting_gets_503_and_nothing_stays_queued() -> None:
    fake, said = await refused({}, 503, KERNEL_LAUNCH_TIMEOUT="0.2")
    assert "as long as the gateway client waits" in said
    assert len(fake.released) == 1 and fake.closed


async def main() -> None:
    await launch_restart_in_place_and_kill()
    await a_bad_kernelspec_is_an_http_error_naming_the_fix()
    await park_after_is_refused_naming_the_key_and_the_way_out()
    await a_client_that_stops_waiting_gets_503_and_nothing_stays_queued()


if __name__ == "__main__":
    asyncio.run(main())
