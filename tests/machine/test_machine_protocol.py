"""The machine queue's wire format, as literal lines: what a peer of this version writes and
reads, and the sentences both sides show."""

from __future__ import annotations

import pytest

from kernel_queue.machine import protocol

QUOTA = protocol.Quota(
    gpus=("0", "1"),
    cpu=8000,
    memory=1073741824,
    queues=("default", "gpu"),
    priority_classes={"high": 100, "low": -100},
)
QUOTA_LINE = (
    '{"cpu": 8000, "gpus": ["0", "1"], "memory": 1073741824, "preemption": "LowerPriority", '
    '"pretend": false, "priority_classes": {"high": 100, "low": -100}, "queues": ["default", '
    '"gpu"], "strategy": "BestEffortFIFO"}'
)

TABLE = [
    (
        protocol.Hello(1, "0.1.0", 42, QUOTA),
        '{"pid": 42, "protocol": 1, "quota": ' + QUOTA_LINE + ', "type": "hello", '
        '"version": "0.1.0", "watch": false}',
    ),
    (
        protocol.Hello(1, "0.1.0", 42, None, watch=True),
        '{"pid": 42, "protocol": 1, "quota": null, "type": "hello", "version": "0.1.0", '
        '"watch": true}',
    ),
    (
        protocol.Submit("kq-a", "a-id", "gpu", 100, {"gpu": 1}, 30.0, "high", "1 GPU"),
        '{"grace": 30.0, "group": "kq-a", "holds": null, "kernel_id": "a-id", "needs": "1 GPU", '
        '"priority": 100, "priority_class": "high", "queue": "gpu", "resources": {"gpu": 1}, '
        '"type": "submit"}',
    ),
    (  # taking a lease back from a service that restarted
        protocol.Submit("kq-a", "a-id", "gpu", 100, {"gpu": 1}, 30.0, holds=("1",)),
        '{"grace": 30.0, "group": "kq-a", "holds": ["1"], "kernel_id": "a-id", "needs": "", '
        '"priority": 100, "priority_class": null, "queue": "gpu", "resources": {"gpu": 1}, '
        '"type": "submit"}',
    ),
    (protocol.Release("kq-a"), '{"group": "kq-a", "type": "release"}'),
    (protocol.Requeue("kq-a"), '{"group": "kq-a", "type": "requeue"}'),
    (protocol.List(), '{"type": "list"}'),
    (
        protocol.Welcome("0.1.0", 7, 1, QUOTA),
        '{"pid": 7, "protocol": 1, "quota": ' + QUOTA_LINE + ', "system": false, "type": '
        '"welcome", "version": "0.1.0"}',
    ),
    (
        protocol.Welcome("0.1.0", 7, 1, QUOTA, system=True),
        '{"pid": 7, "protocol": 1, "quota": ' + QUOTA_LINE + ', "system": true, "type": '
        '"welcome", "version": "0.1.0"}',
    ),
    (
        protocol.Places(
            (protocol.Position("kq-a", "gpu", 1, 2), protocol.Position("kq-b", "gpu", 2, 2, "r"))
        ),
        '{"places": [["kq-a", "gpu", 1, 2, ""], ["kq-b", "gpu", 2, 2, "r"]], "type": "places"}',
    ),
    (
        protocol.Position("kq-a", "gpu", 1, 2),
        '{"group": "kq-a", "length": 2, "position": 1, "queue": "gpu", "reason": "", "type": '
        '"position"}',
    ),
    (
        protocol.Position("kq-a", "gpu", 1, 1, "waiting: root already holds 1 of the 1 GPU"),
        '{"group": "kq-a", "length": 1, "position": 1, "queue": "gpu", "reason": "waiting: root '
        'already holds 1 of the 1 GPU", "type": "position"}',
    ),
    (
        protocol.Admit("kq-a", ("1",)),
        '{"devices": ["1"], "flavor": "local", "group": "kq-a", "type": "admit"}',
    ),
    (
        protocol.Preempt("kq-a", "kq-b", "preempted by higher-priority kernel b", 5.0),
        '{"by": "kq-b", "grace": 5.0, "group": "kq-a", "message": "preempted by '
        'higher-priority kernel b", "type": "preempt"}',
    ),
    (protocol.Refused("no", "kq-a"), '{"group": "kq-a", "message": "no", "type": "refused"}'),
    (
        protocol.Listing((protocol.Entry("kq-a", "a-id", "gpu", 0, "admitted", ("0",)),)),
        '{"gpus": 0, "gpus_in_use": 0, "groups": [{"devices": ["0"], "gpus": 0, "group": '
        '"kq-a", "kernel_id": "a-id", "pid": 0, "position": 0, "priority": 0, "queue": "gpu", '
        '"state": "admitted", "uid": -1, "user": ""}], "hidden": {}, "type": "listing"}',
    ),
    (
        protocol.Listing(
            (protocol.Entry("", "", "gpu", 0, "queued", (), 1, 65534, 0, "nobody", 1),),
            {"admitted": 1},
            2,
            1,
        ),
        '{"gpus": 2, "gpus_in_use": 1, "groups": [{"devices": [], "gpus": 1, "group": "", '
        '"kernel_id": "", "pid": 0, "position": 1, "priority": 0, "queue": "gpu", "state": '
        '"queued", "uid": 65534, "user": "nobody"}], "hidden": {"admitted": 1}, "type": '
        '"listing"}',
    ),
]


@pytest.mark.parametrize(("message", "line"), TABLE, ids=[m.TYPE for m, _ in TABLE])
def test_each_message_is_one_json_line_and_reads_back(message: protocol.Message, line: str) -> None:
    assert protocol.encode(message) == line.encode() + b"\n"
    assert protocol.decode(line.encode()) == message


@pytest.mark.parametrize(
    "line",
    [b"not json", b'{"type": "dance"}', b'{"type": "release"}', b"[1]"],
)
def test_a_line_that_is_no_message_is_a_protocol_error_quoting_it(line: bytes) -> None:
    with pytest.raises(protocol.ProtocolError, match="message"):
        protocol.decode(line)


def test_a_hello_of_another_protocol_is_read_even_when_its_quota_is_not() -> None:
    line = b'{"type": "hello", "protocol": 3, "version": "9.0", "pid": 5, "quota": {"x": 1}}'
    assert protocol.decode(line) == protocol.Hello(3, "9.0", 5, None)


def test_a_line_of_a_peer_without_the_newer_fields_or_with_more_reads_back() -> None:
    # Fields added since protocol 1 have defaults; a peer's fields this one lacks are ignored.
    old = b'{"type": "welcome", "version": "0.1.0", "pid": 7, "protocol": 1}'
    assert protocol.decode(old) == protocol.Welcome("0.1.0", 7, 1, None, system=False)
    newer = b'{"type": "position", "group": "g", "queue": "q", "position": 1, "length": 1, "x": 1}'
    assert protocol.decode(newer) == protocol.Position("g", "q", 1, 1, "")


def test_the_mismatch_sentence_names_the_service_and_both_fixes() -> None:
    service = protocol.Welcome("0.3.0", 4242, 3, None)
    assert protocol.mismatch(service, "0.1.0") == (
        "the machine's kernel-queue service (pid 4242, version 0.3.0, protocol 3) speaks "
        "another protocol than this server (version 0.1.0, protocol 2); stop it with "
        "`kill 4242` (its kernels keep running until their servers stop them) or restart this "
        "server with version 0.3.0"
    )


def test_quota_differences_name_each_setting_both_ways() -> None:
    other = protocol.Quota(("0",), 8000, 1073741824, ("default", "gpu"), {"high": 50})
    assert other.differences(QUOTA) == [
        "gpus ['0'] here, ['0', '1'] in force",
        "priority_classes {'high': 50} here, {'high': 100, 'low': -100} in force",
    ]


def test_the_quota_is_the_local_backends_one_cluster_queue() -> None:
    cq = QUOTA.cluster_queue()
    (group,) = cq.resource_groups
    assert group.covered == {"gpu", "cpu", "memory"}
    assert group.flavors[0].quota == {"gpu": 2, "cpu": 8000, "memory": 1073741824}
    assert (cq.strategy, cq.preemption) == ("BestEffortFIFO", "LowerPriority")


def test_the_quota_gives_the_cluster_queue_the_local_backend_builds_today() -> None:
    from kernel_queue.backends.local import quota

    today = quota.LocalQuota(
        gpus=2,
        cpu="8",
        memory="1Gi",
        queues=("default", "gpu"),
        priority_classes={"high": 100, "low": -100},
        strategy="BestEffortFIFO",
        preemption="LowerPriority",
    )
    assert QUOTA.cluster_queue() == today.cluster_queue()
