"""The fake API server's object store: what a real apiserver keeps in etcd, in memory.

Objects are plain JSON dicts keyed by (group, plural, namespace, name), kept at their kind's
storage version and converted for a request at another served version (`versions.py`). The
store assigns metadata (uid, resourceVersion, generation, creationTimestamp, generateName),
keeps the status subresource apart (`updates.py`), handles finalizers and graceful deletion,
validates custom resources against their schema, and keeps a bounded event log for watches
(`changes.py`). Admission hooks (webhooks) run inside each write; listeners
(controllers) are told after each commit. No HTTP here: `server.py` serves it, controllers call
it directly.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import string
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from kernel_queue_fake_cluster.apiserver import patches, updates, versions
from kernel_queue_fake_cluster.apiserver.changes import ChangeLog, Subscription, WatchEvent
from kernel_queue_fake_cluster.apiserver.errors import ApiError, invalid, not_found
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType, now_rfc3339
from kernel_queue_fake_cluster.common import selectors

AdmissionHook = Callable[[str, Obj | None, Obj | None], Obj | None]
Listener = Callable[[str, Obj], None]
GraceStrategy = Callable[[Obj, int | None], int]
"""`strategy(obj, requested)`: the grace period (seconds) a DELETE asking for `requested` (None:
the object's own) gives `obj`; 0 deletes at once (finalizers aside)."""


class Store:
    """All objects of one fake cluster. Every method runs on the cluster's event loop."""

    def __init__(self, *, history: int = 1000) -> None:
        self.types: dict[tuple[str, str], ResourceType] = {}
        self.resource_version = 1
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._changes = ChangeLog(history)
        self._admission: dict[tuple[str, str], list[AdmissionHook]] = {}
        self._listeners: dict[tuple[str, str], list[Listener]] = {}
        self._graceful: dict[tuple[str, str], GraceStrategy] = {}
        self.versions = versions.Versions()
        """How objects are converted between the served versions of their kind."""

    # -- registry and hooks ------------------------------------------------------------------

    def register(self, rtype: ResourceType) -> None:
        """Serve `rtype` (re-registering replaces its definition, keeping its objects)."""
        self.types[rtype.key] = rtype
        self._objects.setdefault(rtype.key, {})

    def type(self, group: str, plural: str) -> ResourceType:
        """The registered type, or 404 as for an unknown resource path."""
        rtype = self.types.get((group, plural))
        if rtype is None:
            what = f"{plural}.{group}" if group else plural
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({what})"
            )
        return rtype

    def add_admission(self, group: str, plural: str, hook: AdmissionHook) -> None:
        """`hook(operation, new, old)` runs inside CREATE/UPDATE/DELETE writes, in order.

        It returns the (possibly mutated) new object, or None to keep it, and raises ApiError
        to reject the write. `new` is None for DELETE; `old` is None for CREATE.
        """
        self._admission.setdefault((group, plural), []).append(hook)

    def add_listener(self, group: str, plural: str, listener: Listener) -> None:
        """`listener(event_type, obj)` runs after each committed change, soon on the loop."""
        self._listeners.setdefault((group, plural), []).append(listener)

    def add_conversion(self, group: str, plural: str, converter: versions.Converter) -> None:
        """Convert (group, plural) between its versions with `converter` (a conversion
        webhook); without one only `apiVersion` changes."""
        self.versions.add(group, plural, converter)

    def add_graceful(self, group: str, plural: str, strategy: GraceStrategy) -> None:
        """Delete (group, plural) gracefully, as the apiserver does pods: a DELETE to which
        `strategy` gives a grace period > 0 only sets `deletionTimestamp` and
        `deletionGracePeriodSeconds`; the object stays until deleted again with grace 0 (a
        kubelet's last word), then until no finalizer holds it. Other kinds go at once."""
        self._graceful[(group, plural)] = strategy

    # -- reads ---------------------------------------------------------------------------------

    def get(
        self, group: str, plural: str, namespace: str | None, name: str, *, version: str = ""
    ) -> Obj:
        """A copy of one object at `version` ("": the storage version); 404 if absent."""
        rtype = self.type(group, plural)
        found = self._objects[rtype.key].get(self._name_key(rtype, namespace, name))
        if found is None:
            raise not_found(rtype, name)
        return self.versions.at(rtype, copy.deepcopy(found), version)

    def list_objects(
        self,
        group: str,
        plural: str,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
    ) -> tuple[list[Obj], int]:
        """Copies of the matching objects, sorted by namespace and name, and the current RV."""
        rtype = self.type(group, plural)
        match = self._matcher(labels, fields)
        items = [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self._objects[rtype.key].items())
            if (not namespace or ns == namespace) and match(obj)
        ]
        return items, self.resource_version

    def objects(self, group: str, plural: str) -> Iterator[Obj]:
        """The stored objects themselves, read-only, for controllers that scan often."""
        yield from self._objects.get((group, plural), {}).values()

    # -- writes --------------------------------------------------------------------------------

    def create(
        self, group: str, plural: str, namespace: str | None, obj: Obj, *, version: str = ""
    ) -> Obj:
        """POST of `obj` at `version` ("": the storage version): assign metadata, admit,
        validate, store; 409 if the name is taken. Returns it at the storage version."""
        rtype = self.type(group, plural)
        obj = self.versions.incoming(rtype, copy.deepcopy(obj), version)
        meta = obj.setdefault("metadata", {})
        if rtype.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            meta["namespace"] = namespace
            if rtype.key != ("", "namespaces"):
                self._require_namespace(namespace or "")
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    rtype,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                )
            alphabet = string.ascii_lowercase + string.digits
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(alphabet) for _ in range(5)
            )
        obj["kind"] = rtype.kind
        if rtype.status_subresource and not rtype.builtin:
            obj.pop("status", None)  # a custom resource's status is written through /status only
        obj = self._admit(rtype, "CREATE", obj, None)
        key = self._name_key(rtype, meta.get("namespace"), meta["name"])
        if key in self._objects[rtype.key]:
            what = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
            raise ApiError(
                409,
                "AlreadyExists",
                f'{what} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": rtype.group, "kind": rtype.plural},
            )
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        meta.pop("deletionTimestamp", None)
        obj = self.versions.validated(rtype, obj)
        return self._commit(rtype, "ADDED", obj, None)

    def replace(
        self,
        group: str,
        plural: str,
        namespace: str | None,
        name: str,
        obj: Obj,
        *,
        subresource: str = "",
        version: str = "",
    ) -> Obj:
        """PUT of `obj` at `version` ("": the storage version): 409 Conflict on a stale
        `metadata.resourceVersion`. Returns it at the storage version."""
        rtype = self.type(group, plural)
        old = self.get(group, plural, namespace, name)
        wanted = (obj.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rtype.plural} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                {"name": name, "group": rtype.group, "kind": rtype.plural},
            )
        new = self.versions.incoming(rtype, copy.deepcopy(obj), version)
        return self._update(rtype, old, new, subresource)

    def patch(
        self,
        group: str,
        plural: str,
        namespace: str | None,
        name: str,
        body: Any,
        content_type: str,
        *,
        subresource: str = "",
        version: str = "",
    ) -> Obj:
        """PATCH with a JSON, merge or strategic merge patch (415 for SMP on custom kinds),
        applied to the object as served at `version`. Returns it at the storage version."""
        rtype = self.type(group, plural)
        old = self.get(group, plural, namespace, name)
        served = self.versions.at(rtype, old, version)
        patched = patches.apply(served, body, content_type, strategic=rtype.builtin)
        new = self.versions.incoming(rtype, patched, version)
        return self._update(rtype, old, new, subresource)

    def delete(
        self,
        group: str,
        plural: str,
        namespace: str | None,
        name: str,
        *,
        grace_seconds: int | None = None,
        uid: str | None = None,
    ) -> Obj:
        """DELETE: remove, or mark with `deletionTimestamp` while finalizers or a graceful
        termination (`add_graceful`) hold the object; a later DELETE may only shorten the grace
        period. `uid`: a precondition (409 Conflict when the object is another of that name).
        Returns the object as it now stands."""
        rtype = self.type(group, plural)
        old = self.get(group, plural, namespace, name)
        if uid is not None and uid != old["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rtype.plural} "{name}": Precondition failed: '
                f"UID in precondition: {uid}, UID in object meta: {old['metadata']['uid']}",
                {"name": name, "group": rtype.group, "kind": rtype.plural},
            )
        self._admit(rtype, "DELETE", None, old)
        meta = old["metadata"]
        strategy = self._graceful.get(rtype.key)
        grace = strategy(copy.deepcopy(old), grace_seconds) if strategy is not None else 0
        current = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and current is not None and grace >= current:
            return old  # already being deleted: a later DELETE may only shorten the grace
        if grace > 0:
            new = copy.deepcopy(old)
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            new["metadata"].setdefault("deletionTimestamp", now_rfc3339())
            return self._commit(rtype, "MODIFIED", new, old)
        if meta.get("finalizers"):
            new = copy.deepcopy(old)
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"].setdefault("deletionTimestamp", now_rfc3339())
            return self._commit(rtype, "MODIFIED", new, old) if new != old else old
        return self._remove(rtype, old)

    def delete_collection(
        self, group: str, plural: str, namespace: str | None, *, labels: str = "", fields: str = ""
    ) -> list[Obj]:
        """DELETE on a collection: delete every matching object."""
        items, _ = self.list_objects(group, plural, namespace, labels=labels, fields=fields)
        return [
            self.delete(group, plural, item["metadata"].get("namespace"), item["metadata"]["name"])
            for item in items
        ]

    # -- watch -----------------------------------------------------------------------------

    def watch(
        self,
        group: str,
        plural: str,
        namespace: str | None = None,
        *,
        since: int | None = None,
        labels: str = "",
        fields: str = "",
    ) -> Subscription:
        """Subscribe and snapshot in one step. `since` None/0: ADDED for every current object
        first; otherwise replay the log after `since`, or 410 Expired if it left the log."""
        rtype = self.type(group, plural)
        match = self._matcher(labels, fields)
        snapshot = (
            obj
            for (ns, _), obj in sorted(self._objects[rtype.key].items())
            if (not namespace or ns == namespace) and match(obj)
        )
        return self._changes.subscribe(
            rtype.key,
            namespace,
            match,
            since=since,
            current=self.resource_version,
            snapshot=snapshot,
        )

    def close_watches(self) -> None:
        """End every open watch stream (the fake's "drop watches" fault, and shutdown)."""
        self._changes.close_all()

    @property
    def open_watches(self) -> int:
        return self._changes.open

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _name_key(rtype: ResourceType, namespace: str | None, name: str) -> tuple[str, str]:
        return ((namespace or "") if rtype.namespaced else "", name)

    @staticmethod
    def _matcher(labels: str, fields: str) -> selectors.Matcher:
        try:
            by_labels, by_fields = selectors.labels(labels), selectors.fields(fields)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from None
        return lambda obj: by_labels(obj) and by_fields(obj)

    def _require_namespace(self, namespace: str) -> None:
        if ("", namespace) not in self._objects.get(("", "namespaces"), {}):
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )

    def _admit(self, rtype: ResourceType, op: str, new: Obj | None, old: Obj | None) -> Obj:
        for hook in self._admission.get(rtype.key, []):
            changed = hook(op, new, old)
            if changed is not None:
                new = changed
        return new if new is not None else {}

    def _update(self, rtype: ResourceType, old: Obj, new: Obj, subresource: str) -> Obj:
        new = updates.merged(rtype, old, new, subresource)
        new = self._admit(rtype, "UPDATE", new, old)
        old_meta = old["metadata"]
        if subresource == "" and updates.spec(new) != updates.spec(old):
            new["metadata"]["generation"] = int(old_meta.get("generation", 1)) + 1
        new = self.versions.validated(rtype, new)
        if new == old:
            return old  # a no-op write does not bump the resourceVersion
        deleting = old_meta.get("deletionTimestamp") and not old_meta.get(
            "deletionGracePeriodSeconds"
        )
        if deleting and not new["metadata"].get("finalizers"):
            return self._remove(rtype, new)  # the last finalizer is gone
        return self._commit(rtype, "MODIFIED", new, old)

    def _commit(self, rtype: ResourceType, kind: str, obj: Obj, old: Obj | None) -> Obj:
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        meta = obj["metadata"]
        self._objects[rtype.key][self._name_key(rtype, meta.get("namespace"), meta["name"])] = obj
        self._publish(rtype, kind, obj, old)
        return copy.deepcopy(obj)

    def _remove(self, rtype: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        self._objects[rtype.key].pop(
            self._name_key(rtype, meta.get("namespace"), meta["name"]), None
        )
        self.resource_version += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self.resource_version)
        self._publish(rtype, "DELETED", gone, obj)
        return copy.deepcopy(gone)

    def _publish(self, rtype: ResourceType, kind: str, obj: Obj, old: Obj | None) -> None:
        event = WatchEvent(kind, copy.deepcopy(obj), self.resource_version, rtype.key)
        previous = copy.deepcopy(old) if old is not None else None
        self._changes.publish(event, previous)
        listeners = self._listeners.get(rtype.key, [])
        if not listeners:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for listener in listeners:
            if loop is None:
                listener(kind, copy.deepcopy(obj))
            else:
                loop.call_soon(listener, kind, copy.deepcopy(obj))
