"""RBAC in the fake API server: rule evaluation tables, then tokens and 401/403 over HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import kubernetes.aio.client
import pytest

from kernel_queue_fake_cluster.apiserver import rbac, resources
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.rbac import Attributes, User
from kernel_queue_fake_cluster.apiserver.server import Server
from kernel_queue_fake_cluster.apiserver.store import Store

SA = "system:serviceaccount:team-a:kernel"
KERNEL = User(SA)


def role(kind: str, name: str, rules: list[Obj], namespace: str = "") -> Obj:
    meta = {"name": name, "namespace": namespace} if namespace else {"name": name}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta} | {
        "rules": rules
    }


def binding(kind: str, name: str, ref: tuple[str, str], subjects: list[Obj], ns: str = "") -> Obj:
    meta = {"name": name, "namespace": ns} if ns else {"name": name}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": ref[0], "name": ref[1]}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta} | {
        "roleRef": role_ref,
        "subjects": subjects,
    }


SA_SUBJECT = {"kind": "ServiceAccount", "name": "kernel", "namespace": "team-a"}
POLICY = [
    role(
        "Role",
        "kernel",
        [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["c"]},
        ],
        "team-a",
    ),
    binding("RoleBinding", "kernel", ("Role", "kernel"), [SA_SUBJECT], "team-a"),
    role(
        "ClusterRole",
        "queue-reader",
        [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["*"], "verbs": ["get", "list"]}],
    ),
    binding(
        "ClusterRoleBinding",
        "readers",
        ("ClusterRole", "queue-reader"),
        [{"kind": "Group", "name": "system:serviceaccounts:team-b"}],
    ),
    binding(
        "RoleBinding", "kernel-queues", ("ClusterRole", "queue-reader"), [SA_SUBJECT], "team-a"
    ),
    role(
        "ClusterRole",
        "status-writer",
        [{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["patch"]}],
    ),
    binding(
        "ClusterRoleBinding",
        "status",
        ("ClusterRole", "status-writer"),
        [{"kind": "User", "name": "controller"}],
    ),
]


Q = "kueue.x-k8s.io"
CONTROLLER, ADMIN = User("controller"), User("admin", ("system:masters",))
TEAM_B = User("system:serviceaccount:team-b:x")
POLICY_CASES = [  # id, user, (verb, group, resource, subresource, namespace, name), allowed
    ("create", KERNEL, ("create", "", "pods", "", "team-a", ""), True),
    ("verb-not-listed", KERNEL, ("delete", "", "pods", "", "team-a", "p"), False),
    ("role-binding-is-namespaced", KERNEL, ("get", "", "pods", "", "team-b", "p"), False),
    ("subresource-listed", KERNEL, ("get", "", "pods", "log", "team-a", "p"), True),
    ("subresource-not-implied", KERNEL, ("patch", "", "pods", "status", "team-a", "p"), False),
    ("resource-name-listed", KERNEL, ("get", "", "secrets", "", "team-a", "c"), True),
    ("resource-name-not-listed", KERNEL, ("get", "", "secrets", "", "team-a", "d"), False),
    ("resource-names-exclude-lists", KERNEL, ("list", "", "secrets", "", "team-a", ""), False),
    ("group-not-listed", KERNEL, ("get", "apps", "pods", "", "team-a", "p"), False),
    ("cluster-role-in-role-binding", KERNEL, ("list", Q, "workloads", "", "team-a", ""), True),
    ("role-binding-not-cluster-wide", KERNEL, ("list", Q, "clusterqueues", "", "", ""), False),
    ("service-account-namespace-group", TEAM_B, ("list", Q, "clusterqueues", "", "", ""), True),
    ("star-slash-subresource", CONTROLLER, ("patch", Q, "workloads", "status", "ns", "w"), True),
    ("star-slash-needs-subresource", CONTROLLER, ("patch", Q, "workloads", "", "ns", "w"), False),
    ("superuser", ADMIN, ("delete", "", "namespaces", "", "", "team-a"), True),
    ("no-binding", User("nobody"), ("get", "", "pods", "", "team-a", "p"), False),
]


@pytest.mark.parametrize(
    ("user", "attributes", "allowed"),
    [pytest.param(user, Attributes(*a), ok, id=name) for name, user, a, ok in POLICY_CASES],
)
def test_policy_grants_exactly_what_the_rules_say(
    user: User, attributes: Attributes, allowed: bool
) -> None:
    assert rbac.Policy(POLICY).allows(user, attributes) is allowed


ANY = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
PODS_GET = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
ALL_PODS = {**PODS_GET, "resources": ["*"]}
RULE_CASES = [  # id, rule, (verb, group, resource, subresource, namespace, name), allowed
    ("all-stars", ANY, ("deletecollection", "x.io", "things", "", "n", ""), True),
    ("star-covers-subresources", ALL_PODS, ("get", "", "pods", "log", "n", "p"), True),
    ("plain-excludes-subresources", PODS_GET, ("get", "", "pods", "log", "n", "p"), False),
    ("no-verbs", {**PODS_GET, "verbs": []}, ("get", "", "pods", "", "n", ""), False),
]


@pytest.mark.parametrize(
    ("rule", "attributes", "allowed"),
    [pytest.param(rule, Attributes(*a), ok, id=name) for name, rule, a, ok in RULE_CASES],
)
def test_one_rule_matches_verbs_groups_resources_and_names(
    rule: Obj, attributes: Attributes, allowed: bool
) -> None:
    assert rbac.rule_allows(rule, attributes) is allowed


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        pytest.param(
            Attributes("create", "", "pods", namespace="ns"),
            f'pods is forbidden: User "{SA}" cannot create resource "pods" in API group "" '
            'in the namespace "ns"',
            id="collection",
        ),
        pytest.param(
            Attributes("patch", "", "pods", "status", "ns", "p"),
            f'pods "p" is forbidden: User "{SA}" cannot patch resource "pods/status" in API '
            'group "" in the namespace "ns"',
            id="named-subresource",
        ),
        pytest.param(
            Attributes("list", "kueue.x-k8s.io", "clusterqueues"),
            f'clusterqueues.kueue.x-k8s.io is forbidden: User "{SA}" cannot list resource '
            '"clusterqueues" in API group "kueue.x-k8s.io" at the cluster scope',
            id="cluster-scope",
        ),
    ],
)
def test_forbidden_messages_have_the_apiserver_shape(attributes: Attributes, message: str) -> None:
    error = rbac.forbidden(KERNEL, attributes)
    assert (error.code, error.reason, error.message) == (403, "Forbidden", message)
    assert error.status()["details"]["kind"] == attributes.resource


# -- over HTTP ------------------------------------------------------------------------------

TOKENS: dict[str, str | User] = {
    "kernel-token": SA,
    "admin-token": User("admin", ("system:masters",)),
}


@pytest.fixture
def secured(jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[Server]:
    """A server with RBAC on: the kernel service account's Role, and an admin."""
    store = Store()
    resources.install(store, namespaces=("default", "team-a"))
    server = Server(store, tokens=TOKENS, rbac_objects=POLICY)
    jp_asyncio_loop.run_until_complete(server.start())
    yield server
    jp_asyncio_loop.run_until_complete(server.stop())


async def call(
    server: Server, method: str, path: str, token: str | None, body: Any = None
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body)
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.request(method, server.url + path, data=data, headers=headers) as reply,
    ):
        return reply.status, json.loads(await reply.text())


POD = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}


async def test_a_service_account_gets_what_its_role_allows_and_403_otherwise(
    secured: Server,
) -> None:
    config = kubernetes.aio.client.Configuration(host=secured.url)
    config.api_key = {"authorization": "kernel-token"}
    config.api_key_prefix = {"authorization": "Bearer"}
    async with kubernetes.aio.client.ApiClient(config) as api:
        core = kubernetes.aio.client.CoreV1Api(api)
        async with asyncio.timeout(10):
            created = await core.create_namespaced_pod("team-a", POD)
            assert created.metadata.name == "p"
            assert [p.metadata.name for p in (await core.list_namespaced_pod("team-a")).items] == [
                "p"
            ]
            with pytest.raises(kubernetes.aio.client.ApiException) as caught:
                await core.delete_namespaced_pod("p", "team-a")
    status = json.loads(caught.value.body)
    assert (caught.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == (
        f'pods "p" is forbidden: User "{SA}" cannot delete resource "pods" in API group "" '
        'in the namespace "team-a"'
    )


@pytest.mark.parametrize(
    ("method", "path", "message"),
    [
        pytest.param(
            "POST",
            "/api/v1/namespaces/team-a/secrets",
            f'secrets is forbidden: User "{SA}" cannot create resource "secrets" in API group "" '
            'in the namespace "team-a"',
            id="create",
        ),
        pytest.param(
            "PATCH",
            "/api/v1/namespaces/team-a/pods/p/status",
            f'pods "p" is forbidden: User "{SA}" cannot patch resource "pods/status" in API '
            'group "" in the namespace "team-a"',
            id="status",
        ),
        pytest.param(
            "GET",
            "/apis/kueue.x-k8s.io/v1beta2/clusterqueues?watch=true",
            f'clusterqueues.kueue.x-k8s.io is forbidden: User "{SA}" cannot watch resource '
            '"clusterqueues" in API group "kueue.x-k8s.io" at the cluster scope',
            id="cluster-watch",
        ),
        pytest.param(
            "DELETE",
            "/api/v1/namespaces/team-a/pods",
            f'pods is forbidden: User "{SA}" cannot deletecollection resource "pods" in API '
            'group "" in the namespace "team-a"',
            id="deletecollection",
        ),
    ],
)
async def test_forbidden_requests_get_403_with_the_real_message(
    secured: Server, method: str, path: str, message: str
) -> None:
    status, reply = await call(secured, method, path, "kernel-token", {})
    assert (status, reply["kind"], reply["reason"], reply["message"]) == (
        403,
        "Status",
        "Forbidden",
        message,
    )


@pytest.mark.parametrize(
    "token", [pytest.param(None, id="no-token"), pytest.param("made-up", id="unknown-token")]
)
async def test_requests_without_a_known_token_get_401(secured: Server, token: str | None) -> None:
    for path in ("/api/v1/namespaces/team-a/pods", "/apis"):
        status, reply = await call(secured, "GET", path, token)
        assert (status, reply["reason"]) == (401, "Unauthorized")


async def test_discovery_is_open_to_any_authenticated_user(secured: Server) -> None:
    status, reply = await call(secured, "GET", "/api/v1", "kernel-token")
    assert status == 200 and reply["kind"] == "APIResourceList"


async def test_a_binding_created_over_http_takes_effect_at_once(secured: Server) -> None:
    path = "/api/v1/namespaces/team-a/pods"
    await call(secured, "POST", path, "admin-token", POD)
    status, _ = await call(secured, "DELETE", f"{path}/p", "kernel-token")
    assert status == 403
    deleter = role(
        "Role",
        "deleter",
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}],
        "team-a",
    )
    grant = binding("RoleBinding", "deleter", ("Role", "deleter"), [SA_SUBJECT], "team-a")
    rbac_path = "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a"
    assert (await call(secured, "POST", f"{rbac_path}/roles", "admin-token", deleter))[0] == 201
    assert (await call(secured, "POST", f"{rbac_path}/rolebindings", "admin-token", grant))[
        0
    ] == 201
    status, _ = await call(secured, "DELETE", f"{path}/p", "kernel-token")
    assert status == 200
