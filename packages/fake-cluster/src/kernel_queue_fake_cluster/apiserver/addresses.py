"""The apiserver's allocation of Service ClusterIPs, from a loopback `AddressPool`.

`ClusterIPs` is the Service admission that gives each new Service its address (or the one it
asks for) for its whole life, as the apiserver does with or without a node; forwarding to the
Service's pods is the node agent's (`node/network.py`).
"""

from __future__ import annotations

from kernel_queue_fake_cluster.apiserver.errors import invalid
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.common.addresses import AddressPool


class ClusterIPs:
    """The Service admission that allocates ClusterIPs from one `AddressPool` of `store`."""

    def __init__(self, store: Store, pool: str) -> None:
        self.store, self.pool = store, AddressPool(pool)

    def install(self) -> None:
        """Give each new Service a ClusterIP at admission (no forwarding: that is the node's),
        and free it when the Service is gone."""
        self.store.add_admission("", "services", self._admit)
        self.store.add_listener("", "services", self._on_service)

    def _on_service(self, kind: str, service: Obj) -> None:
        meta = service["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED" and not any(
            (s["metadata"]["namespace"], s["metadata"]["name"]) == key
            for s in self.store.objects("", "services")
        ):
            self.pool.release(f"{key[0]}/{key[1]}")

    def _admit(self, operation: str, new: Obj | None, old: Obj | None) -> Obj | None:
        if new is None:
            return None
        spec, meta = new.setdefault("spec", {}), new["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        rtype = self.store.type("", "services")
        if old is not None:  # the ClusterIP stays for the Service's life
            old_spec = old.get("spec") or {}
            if spec.get("clusterIP") in (None, ""):
                for kept in ("clusterIP", "clusterIPs"):
                    if kept in old_spec:
                        spec[kept] = old_spec[kept]
            elif spec["clusterIP"] != old_spec.get("clusterIP"):
                raise invalid(rtype, meta["name"], [("spec.clusterIPs[0]", "field is immutable")])
            return new
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        if spec["type"] == "ExternalName":
            return new
        wanted = spec.get("clusterIP")
        if not spec.get("ports") and wanted != "None":
            raise invalid(rtype, meta["name"], [("spec.ports", "Required value")])
        self._reclaim(key)
        if wanted == "None":
            spec["clusterIPs"] = ["None"]
        else:
            try:
                if wanted:
                    self.pool.reserve(key, wanted)
                else:
                    wanted = self.pool.allocate(key)
            except ValueError as exc:
                cause = f'Invalid value: "{wanted}": {exc}'
                raise invalid(rtype, meta["name"], [("spec.clusterIPs", cause)]) from None
            spec["clusterIP"], spec["clusterIPs"] = wanted, [wanted]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        return new

    def _reclaim(self, keep: str) -> None:
        """Free addresses of Services that never got stored (a later hook rejected the create)."""
        stored = {
            f"{s['metadata']['namespace']}/{s['metadata']['name']}"
            for s in self.store.objects("", "services")
        }
        for key in self.pool.holders():
            if key != keep and key not in stored:
                self.pool.release(key)
