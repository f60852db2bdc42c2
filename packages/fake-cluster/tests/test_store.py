"""The fake API server's object store, in process: metadata, writes, deletes, watches."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kernel_queue_fake_cluster.apiserver import resources
from kernel_queue_fake_cluster.apiserver.changes import Subscription
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store

SECRETS = ("", "secrets")
PODS = ("", "pods")


def make_store(**kwargs: Any) -> Store:
    store = Store(**kwargs)
    resources.install(store, crds=(), namespaces=("default",))
    return store


def pod(name: str, **meta: Any) -> Obj:
    return {"metadata": {"name": name, **meta}, "spec": {"containers": [{"name": "c"}]}}


async def drained(subscription: Subscription) -> list[tuple[str, str]]:
    """Close the watch and return its queued events as (type, name)."""
    subscription.close()
    return [(event.type, event.object["metadata"]["name"]) async for event in subscription]


def test_create_assigns_uid_resource_version_generation_and_timestamp() -> None:
    store = make_store()
    before = store.resource_version
    created = store.create(*SECRETS, "default", {"metadata": {"name": "s"}, "data": {}})
    meta = created["metadata"]
    assert (created["apiVersion"], created["kind"]) == ("v1", "Secret")
    assert meta["namespace"] == "default"
    assert meta["resourceVersion"] == str(before + 1) == str(store.resource_version)
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1
    assert store.get(*SECRETS, "default", "s") == created


def test_generate_name_appends_five_random_characters() -> None:
    store = make_store()
    first = store.create(*SECRETS, "default", {"metadata": {"generateName": "kernel-"}})
    second = store.create(*SECRETS, "default", {"metadata": {"generateName": "kernel-"}})
    assert re.fullmatch(r"kernel-[a-z0-9]{5}", first["metadata"]["name"])
    assert first["metadata"]["name"] != second["metadata"]["name"]


def test_creating_a_taken_name_is_409_already_exists() -> None:
    store = make_store()
    store.create(*SECRETS, "default", {"metadata": {"name": "s"}})
    with pytest.raises(ApiError) as caught:
        store.create(*SECRETS, "default", {"metadata": {"name": "s"}})
    assert (caught.value.code, caught.value.reason) == (409, "AlreadyExists")
    assert caught.value.message == 'secrets "s" already exists'


def test_a_namespaced_object_needs_its_namespace() -> None:
    store = make_store()
    with pytest.raises(ApiError) as caught:
        store.create(*SECRETS, "team-a", {"metadata": {"name": "s"}})
    assert caught.value.code == 404
    assert caught.value.message == 'namespaces "team-a" not found'
    store.create("", "namespaces", None, {"metadata": {"name": "team-a"}})
    assert store.create(*SECRETS, "team-a", {"metadata": {"name": "s"}})["metadata"]["uid"]


def test_replace_with_a_stale_resource_version_is_409_conflict() -> None:
    store = make_store()
    created = store.create(*SECRETS, "default", {"metadata": {"name": "s"}})
    store.replace(*SECRETS, "default", "s", {**created, "data": {"a": "MQ=="}})
    with pytest.raises(ApiError) as caught:
        store.replace(*SECRETS, "default", "s", {**created, "data": {"a": "Mg=="}})
    assert (caught.value.code, caught.value.reason) == (409, "Conflict")
    assert "the object has been modified" in caught.value.message


def test_status_subresource_and_main_resource_change_only_their_own_part() -> None:
    store = make_store()
    created = store.create(*PODS, "default", pod("p"))
    with_status = store.replace(*PODS, "default", "p", {**created, "status": {"phase": "Running"}})
    assert "status" not in with_status  # the main resource ignores .status
    spec = {"containers": [{"name": "c", "image": "x"}]}
    status_write = {**created, "spec": spec, "status": {"phase": "Running"}}
    updated = store.replace(*PODS, "default", "p", status_write, subresource="status")
    assert updated["status"] == {"phase": "Running"}
    assert updated["spec"] == created["spec"]  # the status subresource ignores .spec
    relabelled = {**updated, "metadata": {**updated["metadata"], "labels": {"a": "b"}}}
    kept = store.replace(*PODS, "default", "p", {**relabelled, "status": {"phase": "Failed"}})
    assert kept["status"] == {"phase": "Running"}
    assert kept["metadata"]["labels"] == {"a": "b"}


def test_generation_grows_on_spec_changes_only() -> None:
    store = make_store()
    created = store.create(*PODS, "default", pod("p"))
    labelled = {**created, "metadata": {**created["metadata"], "labels": {"a": "b"}}}
    relabelled = store.replace(*PODS, "default", "p", labelled)
    assert relabelled["metadata"]["generation"] == 1
    status = store.replace(
        *PODS, "default", "p", {**relabelled, "status": {"phase": "Running"}}, subresource="status"
    )
    assert status["metadata"]["generation"] == 1
    respecced = store.replace(*PODS, "default", "p", {**status, "spec": {"containers": []}})
    assert respecced["metadata"]["generation"] == 2


async def test_a_no_op_write_keeps_the_resource_version_and_emits_nothing() -> None:
    store = make_store()
    created = store.create(*SECRETS, "default", {"metadata": {"name": "s"}, "data": {}})
    subscription = store.watch(*SECRETS, "default", since=store.resource_version)
    same = store.replace(*SECRETS, "default", "s", created)
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert store.resource_version == int(created["metadata"]["resourceVersion"])
    assert await drained(subscription) == []


async def test_finalizers_hold_a_deleted_object_until_the_last_one_goes() -> None:
    store = make_store()
    created = store.create(*SECRETS, "default", {"metadata": {"name": "s", "finalizers": ["a/b"]}})
    subscription = store.watch(*SECRETS, "default", since=store.resource_version)
    marked = store.delete(*SECRETS, "default", "s")
    assert marked["metadata"]["deletionTimestamp"]
    assert store.get(*SECRETS, "default", "s")["metadata"]["deletionTimestamp"]
    again = store.delete(*SECRETS, "default", "s")  # deleting again changes nothing
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]
    released = {**marked, "metadata": {**marked["metadata"], "finalizers": []}}
    store.replace(*SECRETS, "default", "s", released)
    with pytest.raises(ApiError) as caught:
        store.get(*SECRETS, "default", "s")
    assert caught.value.code == 404
    assert await drained(subscription) == [("MODIFIED", "s"), ("DELETED", "s")]
    assert created["metadata"]["uid"]


async def test_a_graceful_kind_is_only_marked_until_a_grace_zero_delete() -> None:
    store = make_store()
    store.create(*PODS, "default", pod("p"))
    asked: list[int | None] = []

    def strategy(obj: Obj, requested: int | None) -> int:
        asked.append(requested)
        return 20 if requested is None else requested

    store.add_graceful(*PODS, strategy)
    subscription = store.watch(*PODS, "default", since=store.resource_version)
    terminating = store.delete(*PODS, "default", "p")
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 20
    assert terminating["metadata"]["deletionTimestamp"]
    assert store.delete(*PODS, "default", "p", grace_seconds=25) == terminating  # not longer
    shorter = store.delete(*PODS, "default", "p", grace_seconds=5)
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 5
    assert shorter["metadata"]["deletionTimestamp"] == terminating["metadata"]["deletionTimestamp"]
    store.delete(*PODS, "default", "p", grace_seconds=0)  # the kubelet's final delete
    assert asked == [None, 25, 5, 0]
    assert store.list_objects(*PODS, "default")[0] == []
    events = [("MODIFIED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    assert await drained(subscription) == events


async def test_a_watch_from_a_resource_version_replays_only_later_events() -> None:
    store = make_store()
    store.create(*SECRETS, "default", {"metadata": {"name": "old"}})
    since = store.resource_version
    store.create(*SECRETS, "default", {"metadata": {"name": "new"}})
    store.delete(*SECRETS, "default", "old")
    replayed = store.watch(*SECRETS, "default", since=since)
    current = store.watch(*SECRETS, "default")
    store.create(*SECRETS, "default", {"metadata": {"name": "live"}})
    assert await drained(replayed) == [("ADDED", "new"), ("DELETED", "old"), ("ADDED", "live")]
    assert await drained(current) == [("ADDED", "new"), ("ADDED", "live")]


def test_a_watch_from_a_version_that_left_the_history_is_410_expired() -> None:
    store = make_store(history=3)
    since = store.resource_version
    for index in range(4):
        store.create(*SECRETS, "default", {"metadata": {"name": f"s{index}"}})
    with pytest.raises(ApiError) as caught:
        store.watch(*SECRETS, "default", since=since)
    assert (caught.value.code, caught.value.reason) == (410, "Expired")
    store.watch(*SECRETS, "default", since=store.resource_version - 3).close()  # still kept


async def test_label_changes_turn_modified_into_added_or_deleted_for_a_selector() -> None:
    store = make_store()
    created = store.create(*SECRETS, "default", {"metadata": {"name": "s"}})
    subscription = store.watch(*SECRETS, "default", labels="app=kernel")

    def labelled(labels: dict[str, str]) -> Obj:
        current = store.get(*SECRETS, "default", "s")
        return {**current, "metadata": {**current["metadata"], "labels": labels}}

    store.replace(*SECRETS, "default", "s", labelled({"app": "kernel"}))
    store.replace(*SECRETS, "default", "s", labelled({"app": "kernel", "x": "y"}))
    store.replace(*SECRETS, "default", "s", labelled({"app": "other"}))
    store.replace(*SECRETS, "default", "s", labelled({}))
    assert await drained(subscription) == [("ADDED", "s"), ("MODIFIED", "s"), ("DELETED", "s")]
    assert created["metadata"]["name"] == "s"


@pytest.mark.parametrize(
    ("labels", "fields", "names"),
    [
        pytest.param("app=kernel", "", ["a", "b"], id="label-equality"),
        pytest.param("app in (kernel),tier!=gpu", "", ["b"], id="label-set-and-inequality"),
        pytest.param("!tier", "", ["c"], id="label-absent"),
        pytest.param("", "metadata.name=c", ["c"], id="field-name"),
        pytest.param("app", "metadata.name!=a", ["b"], id="label-exists-and-field"),
    ],
)
def test_lists_filter_by_label_and_field_selectors(
    labels: str, fields: str, names: list[str]
) -> None:
    store = make_store()
    for name, object_labels in (
        ("a", {"app": "kernel", "tier": "gpu"}),
        ("b", {"app": "kernel", "tier": "cpu"}),
        ("c", {}),
    ):
        store.create(*SECRETS, "default", {"metadata": {"name": name, "labels": object_labels}})
    items, _ = store.list_objects(*SECRETS, "default", labels=labels, fields=fields)
    assert [item["metadata"]["name"] for item in items] == names


def test_a_bad_selector_is_400() -> None:
    store = make_store()
    with pytest.raises(ApiError) as caught:
        store.list_objects(*SECRETS, labels="a in (b")
    assert caught.value.code == 400


# -- a kind served at two versions -------------------------------------------------------------

GADGET_SCHEMAS = {
    # v1 names the field `colour`, v2 (the storage version) `color`; both are enums
    version: {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {field: {"type": "string", "enum": ["red", "blue"]}},
            }
        },
    }
    for version, field in (("v1", "colour"), ("v2", "color"))
}
GADGETS = ResourceType(
    "example.com",
    "gadgets",
    "Gadget",
    versions=("v1", "v2"),
    status_subresource=False,
    builtin=False,
    schemas=GADGET_SCHEMAS,
)


def convert_gadget(obj: Obj, api_version: str) -> Obj:
    """v1 `spec.colour` ↔ v2 `spec.color`, as a conversion webhook would."""
    new, spec = {**obj, "apiVersion": api_version}, dict(obj.get("spec") or {})
    old_field, new_field = (
        ("colour", "color") if api_version.endswith("/v2") else ("color", "colour")
    )
    if old_field in spec:
        spec[new_field] = spec.pop(old_field)
    return {**new, "spec": spec}


def gadget_store(converted: bool = True) -> Store:
    store = make_store()
    store.register(GADGETS)
    if converted:
        store.add_conversion("example.com", "gadgets", convert_gadget)
    return store


def gadget(version: str, **spec: str) -> Obj:
    return {"apiVersion": f"example.com/{version}", "metadata": {"name": "g"}, "spec": spec}


def test_an_object_written_at_one_version_is_stored_at_the_storage_version_and_read_at_any() -> (
    None
):
    store = gadget_store()
    created = store.create(
        "example.com", "gadgets", "default", gadget("v1", colour="red"), version="v1"
    )
    assert (created["apiVersion"], created["spec"]) == ("example.com/v2", {"color": "red"})
    at_v1 = store.get("example.com", "gadgets", "default", "g", version="v1")
    assert (at_v1["apiVersion"], at_v1["spec"]) == ("example.com/v1", {"colour": "red"})
    patched = store.patch(
        "example.com",
        "gadgets",
        "default",
        "g",
        {"spec": {"colour": "blue"}},
        "application/merge-patch+json",
        version="v1",
    )
    assert patched["spec"] == {"color": "blue"}
    replaced = store.replace(
        "example.com", "gadgets", "default", "g", gadget("v1", colour="red"), version="v1"
    )
    assert replaced["spec"] == {"color": "red"}


def test_a_write_is_validated_at_the_version_it_names() -> None:
    store = gadget_store()
    with pytest.raises(ApiError) as caught:
        store.create(
            "example.com", "gadgets", "default", gadget("v1", colour="green"), version="v1"
        )
    assert caught.value.code == 422
    assert "spec.colour: Unsupported value" in caught.value.message
    with pytest.raises(ApiError) as caught:
        store.create("example.com", "gadgets", "default", gadget("v2", color="green"), version="v2")
    assert "spec.color: Unsupported value" in caught.value.message


def test_a_kind_without_a_converter_changes_only_its_api_version() -> None:
    store = gadget_store(converted=False)
    store.create("example.com", "gadgets", "default", gadget("v2", color="red"), version="v2")
    at_v1 = store.get("example.com", "gadgets", "default", "g", version="v1")
    assert (at_v1["apiVersion"], at_v1["spec"]) == ("example.com/v1", {"color": "red"})
