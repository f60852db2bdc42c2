"""Loopback addresses for the fake cluster: the pools pod IPs and Service ClusterIPs come from.

`AddressPool` hands out distinct 127.x.y.z addresses (Linux routes all of 127/8 to `lo`), kept
apart across every pool of the process (several fake clusters, or the API server's ClusterIPs
and a node agent's pod IPs in one process).
"""

from __future__ import annotations

import ipaddress
import random

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

    def address(self, key: str) -> str | None:
        """The address `key` holds, or None (nothing is taken)."""
        return self._by_key.get(key)

    def release(self, key: str) -> None:
        """Free the address `key` holds, if any."""
        address = self._by_key.pop(key, None)
        if address is not None:
            _TAKEN.discard(address)

    def holders(self) -> list[str]:
        """Current holders."""
        return list(self._by_key)
