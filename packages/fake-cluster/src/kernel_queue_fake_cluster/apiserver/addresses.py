"""Loopback addresses for the fake cluster: the pool pod IPs and Service ClusterIPs come from,
and the apiserver's allocation of ClusterIPs.

`AddressPool` hands out distinct 127.x.y.z addresses (Linux routes all of 127/8 to `lo`), kept
apart across every fake cluster of the process. `ClusterIPs` is the Service admission that gives
each new Service its address (or the one it asks for) for its whole life, as the apiserver does
with or without a node; forwarding to the Service's pods is the node's (`node/network.py`).
"""

from __future__ import annotations

import ipaddress
import random

from kernel_queue_fake_cluster.apiserver.errors import invalid
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store

_TAKEN: set[str] = set()  # addresses held by any pool of this process (several fake clusters)


class AddressPool:
    """Distinct addresses from one 127/8 subnet, keyed by their holder (pod uid, Service name).

    Allocation walks forward from a random offset and skips x.y.z.0 and x.y.z.255, so a freed
    address is not handed out again soon and two test processes rarely collide.
    """

    def __init__(self, cidr: str) -> None:
        network = ipaddress.IPv4Network(cidr)
        if not network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
            raise ValueError(f"{cidr} is not inside 127.0.0.0/8 (only loopback reaches lo)")
        self.network = network
        edge = 1 if network.num_addresses > 2 else 0
        self._first = int(network.network_address) + edge
        self._size = network.num_addresses - 2 * edge
        self._cursor = random.randrange(self._size)  # other test processes start elsewhere
        self._by_key: dict[str, str] = {}

    def allocate(self, key: str) -> str:
        """The address held by `key`, taking a free one if it holds none."""
        if key in self._by_key:
            return self._by_key[key]
        for step in range(self._size):
            index = (self._cursor + step) % self._size
            number = self._first + index
            address = str(ipaddress.IPv4Address(number))
            if (number & 0xFF in (0, 255) and self._size > 2) or address in _TAKEN:
                continue
            self._cursor = index + 1
            _TAKEN.add(address)
            self._by_key[key] = address
            return address
        raise RuntimeError(f"address pool {self.network} is exhausted")

    def reserve(self, key: str, address: str) -> None:
        """Give `key` a chosen address; ValueError if it is outside the pool or taken."""
        if ipaddress.IPv4Address(address) not in self.network:
            raise ValueError(
                f"provided IP is not in the valid range. The range of valid IPs is {self.network}"
            )
        if self._by_key.get(key) == address:
            return
        if address in _TAKEN:
            raise ValueError(f"provided IP is already allocated ({address})")
        self.release(key)
        _TAKEN.add(address)
        self._by_key[key] = address

    def release(self, key: str) -> None:
        """Free the address `key` holds, if any."""
        address = self._by_key.pop(key, None)
        if address is not None:
            _TAKEN.discard(address)

    def holders(self) -> list[str]:
        """Current holders."""
        return list(self._by_key)


class ClusterIPs:
    """The Service admission that allocates ClusterIPs from one `AddressPool` of `store`."""

    def __init__(self, store: Store, pool: str) -> None:
        self.store, self.pool = store, AddressPool(pool)

    def install(self) -> None:
        """Give each new Service a ClusterIP at admission (no forwarding: that is the node's)."""
        self.store.add_admission("", "services", self._admit)

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
