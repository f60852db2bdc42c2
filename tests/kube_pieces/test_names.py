"""Names Kubernetes accepts: sanitizers, validators and our object names, as literal tables."""

from __future__ import annotations

import itertools

import pytest

from kernel_queue import model
from kernel_queue.kube import names

KERNEL_ID = "1a2b3c4d-5e6f-4a0b-8c9d-0e1f2a3b4c5d"
NASTY = [
    "",
    "-",
    "--",
    "...",
    "@@@",
    "a",
    "A",
    "alice",
    "Alice",
    "alice@example.com",
    "Alice Smith@example.com",
    "alice_",
    "_alice",
    "ünïcode",
    "a" * 63,
    "a" * 64,
    "b" * 300,
    "x." * 130,
    "kq-1a2b3c4d",
    "KQ-1A2B3C4D",
    "a..b",
    "a-.b",
    "0123456789" * 7,
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("alice", "alice", id="valid-kept"),
        pytest.param("", "", id="empty-is-valid"),
        pytest.param("Alice.Smith_1", "Alice.Smith_1", id="dots-underscores-capitals-kept"),
        pytest.param("alice@example.com", "alice-example.com-ff8d9819", id="at-sign"),
        pytest.param("Alice Smith@example.com", "Alice-Smith-example.com-31cd9f1a", id="space"),
        pytest.param("-x-", "x-c6cf95e5", id="dash-ends-trimmed"),
        pytest.param("alice_", "alice-2310328f", id="underscore-end"),
        pytest.param("@@@", "2ec847d8", id="nothing-left-hash-only"),
        pytest.param("ünïcode", "n-code-b8be8967", id="non-ascii"),
        pytest.param("a" * 63, "a" * 63, id="63-kept"),
        pytest.param("a" * 70, "a" * 54 + "-6bd5e503", id="too-long-truncated"),
    ],
)
def test_label_value_sanitizes_and_marks_changes_with_a_hash(text: str, expected: str) -> None:
    assert names.label_value(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("kq-1a2b", "kq-1a2b", id="valid-kept"),
        pytest.param("0abc", "0abc", id="leading-digit-ok"),
        pytest.param("Alice", "alice-3bc51062", id="capitals-lowered-and-hashed"),
        pytest.param("kq-1A2B", "kq-1a2b-d46d44e6", id="mixed-case"),
        pytest.param("a_b", "a-b-648fa9b3", id="underscore"),
        pytest.param("--", "d8156bae", id="nothing-left-hash-only"),
        pytest.param("b" * 70, "b" * 54 + "-b9444034", id="too-long-truncated"),
    ],
)
def test_dns_label_sanitizes_and_marks_changes_with_a_hash(text: str, expected: str) -> None:
    assert names.dns_label(text) == expected


@pytest.mark.parametrize(
    ("text", "label", "value"),
    [
        pytest.param("abc", True, True, id="plain"),
        pytest.param("", False, True, id="empty"),
        pytest.param("a.b", False, True, id="dot"),
        pytest.param("A", False, True, id="capital"),
        pytest.param("a_b", False, True, id="underscore"),
        pytest.param("-a", False, False, id="leading-dash"),
        pytest.param("a-", False, False, id="trailing-dash"),
        pytest.param("a" * 63, True, True, id="63"),
        pytest.param("a" * 64, False, False, id="64"),
        pytest.param("a" * 253, False, False, id="253"),
    ],
)
def test_validators(text: str, label: bool, value: bool) -> None:
    assert names.is_dns_label(text) is label
    assert names.is_label_value(text) is value


@pytest.mark.parametrize(
    ("text", "subdomain", "queue"),
    [
        pytest.param("user-queue", True, True, id="plain"),
        pytest.param("team.gpu", True, True, id="dotted"),
        pytest.param("0queue", True, True, id="leading-digit"),
        pytest.param("", False, False, id="empty"),
        pytest.param("a/b", False, False, id="slash"),
        pytest.param("..", False, False, id="dot-dot"),
        pytest.param("a..b", False, False, id="empty-part"),
        pytest.param(".a", False, False, id="leading-dot"),
        pytest.param("a-.b", False, False, id="dash-before-dot"),
        pytest.param("Queue", False, False, id="capital"),
        pytest.param("a_b", False, False, id="underscore"),
        pytest.param("gpu\ud800", False, False, id="lone-surrogate"),
        pytest.param("gpu\n", False, False, id="newline"),
        pytest.param("a" * 63, True, True, id="63"),
        pytest.param("a" * 64, True, False, id="64-no-label-limit-in-subdomains"),
        pytest.param(".".join(["a" * 63] * 4)[:253], True, False, id="253"),
        pytest.param("a." * 126 + "ab", False, False, id="254"),
    ],
)
def test_subdomain_and_queue_name_validators(text: str, subdomain: bool, queue: bool) -> None:
    assert names.is_dns_subdomain(text) is subdomain
    assert names.is_queue_name(text) is queue


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        pytest.param("nvidia.com/gpu", True, id="nvidia"),
        pytest.param("amd.com/gpu", True, id="amd"),
        pytest.param("example.com/Fancy_GPU.v2", True, id="name-may-have-capitals"),
        pytest.param("gpu", False, id="no-domain"),
        pytest.param("nvidia.com/", False, id="no-name"),
        pytest.param("/gpu", False, id="empty-domain"),
        pytest.param("a/b/c", False, id="two-slashes"),
        pytest.param("Nvidia.com/gpu", False, id="capital-domain"),
        pytest.param("kubernetes.io/gpu", False, id="reserved-domain"),
        pytest.param("nvidia.com/" + "g" * 64, False, id="name-too-long"),
    ],
)
def test_extended_resource_names(text: str, valid: bool) -> None:
    assert names.is_extended_resource(text) is valid


@pytest.mark.parametrize("text", NASTY)
def test_every_sanitizer_output_is_valid_and_stable(text: str) -> None:
    assert names.is_label_value(names.label_value(text))
    assert names.is_dns_label(names.dns_label(text))
    for sanitize in (names.label_value, names.dns_label):
        once = sanitize(text)
        assert sanitize(text) == once  # deterministic
        assert sanitize(once) == once  # a valid name is left alone


def test_distinct_inputs_give_distinct_outputs() -> None:
    for sanitize in (names.label_value, names.dns_label):
        outputs = [sanitize(text) for text in NASTY]
        assert len(set(outputs)) == len(set(NASTY)), sanitize.__name__
    # Names differing only where they were cut or in a replaced character stay apart.
    assert names.label_value("a" * 64) != names.label_value("a" * 65)
    assert names.label_value("alice@x") != names.label_value("alice#x")
    assert names.dns_label("Alice") != names.dns_label("alice")


@pytest.mark.parametrize(
    ("kernel_id", "launch", "expected"),
    [
        pytest.param(KERNEL_ID, 0, "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d", id="first-launch"),
        pytest.param(KERNEL_ID, 1, "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-1", id="second-launch"),
        pytest.param(
            KERNEL_ID, 12, "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-12", id="thirteenth-launch"
        ),
        pytest.param(
            KERNEL_ID.upper(), 0, "kq-d760345b3e4c560c957173e261c22391", id="upper-case-uuid-hashed"
        ),
        pytest.param("My Kernel", 0, "kq-d9eb273856f06cfb98bca9e2c34422a8", id="not-a-uuid-hashed"),
        pytest.param("abc", 0, "kq-ba7816bf8f01cfea414140de5dae2223", id="short-id-hashed"),
    ],
)
def test_group_name(kernel_id: str, launch: int, expected: str) -> None:
    assert names.group_name(kernel_id, launch) == expected
    assert names.is_dns_label(expected)


def test_group_name_of_the_first_launch_matches_the_model() -> None:
    assert names.group_name(KERNEL_ID, 0) == model.group_name(KERNEL_ID)


def test_group_name_rejects_a_negative_launch() -> None:
    with pytest.raises(ValueError, match="launch"):
        names.group_name(KERNEL_ID, -1)


@pytest.mark.parametrize(
    ("group", "role", "index", "attempt", "expected"),
    [
        pytest.param("kq-1a2b3c4d", "head", 0, 0, "kq-1a2b3c4d-head-0", id="head"),
        pytest.param("kq-1a2b3c4d", "head", 0, 3, "kq-1a2b3c4d-head-3", id="head-replacement"),
        pytest.param("kq-1a2b3c4d", "worker", 1, 0, "kq-1a2b3c4d-w1-0", id="worker"),
        pytest.param("kq-1a2b3c4d-2", "worker", 7, 1, "kq-1a2b3c4d-2-w7-1", id="later-launch"),
    ],
)
def test_pod_name(group: str, role: str, index: int, attempt: int, expected: str) -> None:
    assert names.pod_name(group, role, index, attempt) == expected
    assert names.pod_attempt(expected) == attempt  # the round read back (which head is newest)


def test_a_pod_name_not_of_ours_has_no_round() -> None:
    assert names.pod_attempt("kq-1a2b3c4d-head") == -1
    assert names.pod_attempt("") == -1


@pytest.mark.parametrize(
    ("role", "index", "attempt"),
    [
        pytest.param("head", 1, 0, id="head-not-0"),
        pytest.param("worker", 0, 0, id="worker-0"),
        pytest.param("chief", 0, 0, id="unknown-role"),
        pytest.param("head", 0, -1, id="negative-attempt"),
    ],
)
def test_pod_name_rejects_impossible_members(role: str, index: int, attempt: int) -> None:
    with pytest.raises(ValueError):
        names.pod_name("kq-1a2b3c4d", role, index, attempt)


def test_pod_names_never_collide_across_launches_members_and_attempts() -> None:
    seen = set()
    for launch, index, attempt in itertools.product(range(12), range(12), range(12)):
        role = "head" if index == 0 else "worker"
        name = names.pod_name(names.group_name(KERNEL_ID, launch), role, index, attempt)
        assert names.is_dns_label(name)
        seen.add(name)
    assert len(seen) == 12**3


def test_pod_names_stay_valid_labels_when_the_group_is_long() -> None:
    name = names.pod_name("g" * 60, "worker", 15, 99)
    assert names.is_dns_label(name)
    assert name != names.pod_name("g" * 60, "worker", 15, 98)


def test_service_and_secret_names_are_stable_across_launches() -> None:
    assert names.service_name(KERNEL_ID) == "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d"
    assert names.secret_name(KERNEL_ID) == "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-key"
    assert names.service_name("My Kernel") == "kq-d9eb273856f06cfb98bca9e2c34422a8"
    assert names.secret_name("My Kernel") == "kq-d9eb273856f06cfb98bca9e2c34422a8-key"


def test_distinct_kernels_get_distinct_names() -> None:
    other = "9f8e7d6c-5e6f-4a0b-8c9d-0e1f2a3b4c5d"
    for build in (names.service_name, names.secret_name):
        assert build(KERNEL_ID) != build(other)
    assert names.group_name(KERNEL_ID, 0) != names.group_name(other, 0)
