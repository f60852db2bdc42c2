"""A DELETE raced against every step of a kernel's start, by a client in another thread.

A client of its own (a thread with blocking HTTP on the server's real port, as a browser or
`curl` is another process) sends `POST /api/kernels` and, `offset` seconds after its answer,
`DELETE /api/kernels/<id>`. In-process clients on the server's own loop cannot do this: their
reply is read only after the server's loop ran the start further, so they never hit the first
milliseconds of a start, where the DELETE hung (issue 27).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

OFFSETS = (0.0, 0.001, 0.01, 0.1)
"""Seconds after the POST's answer the DELETEs are sent at."""
ANSWER_WITHIN = 20.0
"""Seconds a DELETE may take before it counts as never answered (it answers in milliseconds)."""


@dataclass(frozen=True)
class Outcome:
    """One start and its DELETE: the DELETE's HTTP status (0: it did not answer) and how long
    it took."""

    kernel_id: str
    offset: float
    status: int
    seconds: float

    def __str__(self) -> str:
        answer = f"HTTP {self.status}" if self.status else "no answer"
        return f"DELETE {self.offset * 1000:g} ms after the POST: {answer} in {self.seconds:.2f} s"


class Client:
    """Blocking REST calls on the server's real port (run them in a thread)."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.headers = url.rstrip("/"), {"Authorization": f"token {token}"}

    def call(
        self, method: str, path: str, body: object = None, timeout: float = 30
    ) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, method=method, headers=self.headers, data=data
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def start_and_delete(self, name: str, offset: float) -> Outcome:
        status, body = self.call("POST", "/api/kernels", {"name": name})
        assert status == 201, f"POST /api/kernels answered {status}: {body[:300]!r}"
        kernel_id = json.loads(body)["id"]
        time.sleep(offset)
        started = time.monotonic()
        try:
            status, _ = self.call("DELETE", f"/api/kernels/{kernel_id}", timeout=ANSWER_WITHIN)
        except TimeoutError:
            status = 0
        return Outcome(kernel_id, offset, status, time.monotonic() - started)


async def race(
    url: str, token: str, name: str, offsets: tuple[float, ...], repeat: int
) -> list[Outcome]:
    """Start kernelspec `name` and DELETE it `offset` s later, `repeat` times per offset, one
    after another; every outcome, in order."""
    client = Client(url, token)

    def run() -> list[Outcome]:
        return [client.start_and_delete(name, o) for o in offsets for _ in range(repeat)]

    return await asyncio.to_thread(run)
