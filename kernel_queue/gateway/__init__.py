"""Enterprise Gateway 3.x support: `KueueProcessProxy`, a process proxy over the same backends.

EG 3.x pins jupyter_client<7, so it runs process proxies, not provisioners. The proxy reuses the
kernelspec options (`options.py`), the spec builder, the backends and the kernel session; it
lives in EG's own environment (`pip install "kernel-queue[enterprise-gateway]"`). A kernelspec
names it as `metadata.process_proxy.class_name` = `kernel_queue.gateway.KueueProcessProxy`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CLASS_NAME", "KueueProcessProxy"]

CLASS_NAME = "kernel_queue.gateway.KueueProcessProxy"
"""What kernel.json's `metadata.process_proxy.class_name` names."""


def __getattr__(name: str) -> Any:
    # Lazy: the proxy imports Enterprise Gateway, which only EG's environment has.
    if name == "KueueProcessProxy":
        from kernel_queue.gateway.proxy import KueueProcessProxy

        return KueueProcessProxy
    raise AttributeError(f"module 'kernel_queue.gateway' has no attribute {name!r}")
