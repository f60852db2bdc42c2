"""Nonsense sent to the server's endpoints is answered as jupyter_server answers its own
mistakes, with a sentence, and starts nothing: a kernel name that is not a string (400), one no
kernelspec has (404; it was 201 and a kernel that failed later), bad credentials (403)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import KernelspecFactory, Server


async def _answer(jp_fetch: Any, *path: str, **options: Any) -> tuple[int, dict[str, Any]]:
    try:
        done = await jp_fetch(*path, **options)
    except HTTPClientError as exc:
        assert exc.response is not None
        return exc.code, json.loads(exc.response.body or b"{}")
    return done.code, json.loads(done.body or b"{}")


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [
        (5, 400, "a kernel's name must be a kernelspec's name (a string), not 5"),
        (["a"], 400, "a kernel's name must be a kernelspec's name (a string), not ['a']"),
        ("", 400, "a kernel's name must be a kernelspec's name (a string), not ''"),
        (
            "no-such-spec",
            404,
            "no kernelspec named 'no-such-spec': `jupyter kernelspec list` shows those there are",
        ),
    ],
)
async def test_a_kernel_name_that_names_no_kernelspec_starts_nothing(
    server: Server, jp_fetch: Any, name: object, code: int, message: str
) -> None:
    answer = await _answer(
        jp_fetch, "api", "kernels", method="POST", body=json.dumps({"name": name})
    )
    assert answer == (code, {"message": message, "reason": None})
    assert await _answer(jp_fetch, "api", "kernels") == (200, [])  # type: ignore[comparison-overlap]


@pytest.mark.parametrize("credentials", ["bearer garbage", "token garbage", "garbage"])
async def test_bad_credentials_get_jupyter_servers_own_answer_on_every_endpoint(
    server: Server, jp_fetch: Any, kernelspec: KernelspecFactory, credentials: str
) -> None:
    kernel = await server.start(kernelspec("bad-auth", gpus=0))
    headers = {"Authorization": credentials}
    for path in (
        ("api", "kernels"),
        ("api", "kernel-queue", "kernels"),
        ("api", "kernel-queue", "queues"),
        ("api", "kernel-queue", "machine"),
    ):
        assert (await _answer(jp_fetch, *path, headers=headers))[0] == 403, path
    for path in (
        ("api", "kernels", kernel, "interrupt"),
        ("api", "kernel-queue", "kernels", kernel, "park"),
        ("api", "kernel-queue", "kernels", kernel, "resume"),
    ):
        answer = await _answer(jp_fetch, *path, method="POST", body="", headers=headers)
        assert answer[0] == 403, path
    await server.shutdown_and_wait(kernel)
