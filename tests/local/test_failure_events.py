"""A kernel that fails before or while waiting (more GPUs than exist, an unknown queue or
priority class, its admission timeout, a kernelspec config refused before it is queued) emits a
`failed` status event with its sentence, and the queue listing keeps it with its queue and that
sentence (it read `queue: null`), until it is shut down."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml

from kernel_queue import events
from tests import polling
from tests.conftest import EventLog, KernelspecFactory, Server


async def listing(server: Server) -> dict[str, dict[str, Any]]:
    response = await server.fetch("api", "kernel-queue", "kernels", method="GET")
    return {k["id"]: k for k in json.loads(response.body)}


CASES = [
    # A kernel that could never fit says, as a field, what the machine has in all (2 GPUs).
    pytest.param(
        {"gpus": 3}, "gpu", "3 GPU(s)", "never_fits", {"gpus": 2}, id="more-gpus-than-exist"
    ),
    pytest.param({"queue": "nosuch"}, "nosuch", "'nosuch'", "queue_not_found", None, id="no-queue"),
    pytest.param(
        {"priority_class": "urgent"},
        "gpu",
        "'urgent'",
        "priority_class_not_found",
        None,
        id="no-priority-class",
    ),
    # Refused before anything is submitted (the kernelspec's config), as a kernel is too.
    pytest.param({"gpus": -1}, "gpu", "`gpus` is -1", "config", None, id="negative-gpus"),
    pytest.param({"backend": "slurm"}, "gpu", "'slurm'", "config", None, id="unknown-backend"),
    pytest.param(
        {"queue": "nosuch", "gpus": "1"}, "nosuch", "'gpus'", "config", None, id="gpus-text"
    ),
]


@pytest.mark.parametrize(("config", "queue", "named", "failure", "has"), CASES)
async def test_a_kernel_that_cannot_start_emits_failed_and_stays_listed_with_its_queue(
    server: Server,
    kernelspec: KernelspecFactory,
    event_log: EventLog,
    config: dict[str, Any],
    queue: str,
    named: str,
    failure: str,
    has: dict[str, int] | None,
) -> None:
    kernel = await server.start(kernelspec(**config))
    failed = await polling.until(
        lambda: [
            e for e in event_log.events if e["kernel_id"] == kernel and e["state"] == "failed"
        ],
        "a failed event",
        detail=lambda: event_log.events,
    )
    event = failed[-1]
    assert named in event["message"]
    assert event["queue"] == queue
    assert event["failure"] == failure
    assert event.get("has") == has
    schema = yaml.safe_load(events.SCHEMA_PATH.read_text())
    jsonschema.validate({k: v for k, v in event.items() if not k.startswith("__")}, schema)

    entry = (await listing(server))[kernel]
    assert entry["execution_state"] == "dead"
    assert entry["queue"]["state"] == "failed"
    assert entry["queue"]["queue"] == queue
    assert entry["queue"]["message"] == event["message"] == entry["reason"]
    await server.shutdown(kernel)
    assert kernel not in await listing(server)


async def test_an_admission_timeout_emits_failed_with_its_sentence_and_queue(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog
) -> None:
    holder = await server.start(kernelspec(gpus=2))  # both GPUs
    assert (await server.execute(holder, "1+1"))["data"] == "2"
    kernel = await server.start(kernelspec("impatient", gpus=1, admission_timeout=1))
    failed = await polling.until(
        lambda: [
            e for e in event_log.events if e["kernel_id"] == kernel and e["state"] == "failed"
        ],
        "a failed event",
        detail=lambda: event_log.events,
    )
    assert "admission_timeout" in failed[-1]["message"]
    assert failed[-1]["failure"] == "admission_timeout"
    entry = (await listing(server))[kernel]
    assert (entry["queue"]["state"], entry["queue"]["queue"]) == ("failed", "gpu")
    assert entry["queue"]["message"] == failed[-1]["message"]
    await server.shutdown_and_wait(kernel, holder)
