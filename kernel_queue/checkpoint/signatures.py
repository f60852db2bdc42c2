"""Manifest seals: a checksum that tells a damaged manifest, and an HMAC that tells a foreign one.

Both cover the manifest's canonical JSON (sorted keys, no spaces) without the seal fields; the
manifest holds every payload's digest, so the HMAC vouches for the whole checkpoint. The HMAC key
is derived from the kernel's connection key (`derive`), never that key itself. Stdlib only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

CHECKSUM, SIGNATURE = "checksum", "signature"
"""The manifest fields this module writes and checks."""
CONTEXT = b"kernel-queue checkpoint v1"
"""What the connection key is HMAC'd over to make the checkpoint secret."""


def derive(key: bytes) -> bytes:
    """The checkpoint secret of a kernel whose connection key is `key` (non-empty)."""
    if not key:
        raise ValueError("an empty connection key makes no checkpoint secret")
    return hmac.new(key, CONTEXT, hashlib.sha256).digest()


def seal(record: Mapping[str, Any], secret: bytes | None) -> dict[str, Any]:
    """`record` with its checksum and, given a secret, its signature."""
    body = _canonical(record)
    sealed = {**record, CHECKSUM: "sha256:" + hashlib.sha256(body).hexdigest()}
    if secret is not None:
        sealed[SIGNATURE] = "hmac-sha256:" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return sealed


def damage(manifest: Mapping[str, Any]) -> str:
    """Why `manifest`'s checksum does not hold ("" when it does)."""
    expected = manifest.get(CHECKSUM)
    if not isinstance(expected, str):
        return "its manifest has no checksum"
    try:
        body = _canonical(manifest)
    except ValueError:
        return "its manifest holds values that are not plain JSON"
    if not _same(expected, "sha256:" + hashlib.sha256(body).hexdigest()):
        return "its manifest was changed or cut after it was written"
    return ""


def foreign(manifest: Mapping[str, Any], secret: bytes) -> str:
    """Why `manifest` is not signed with `secret` ("" when it is)."""
    signature = manifest.get(SIGNATURE)
    if not isinstance(signature, str):
        return "it carries no signature"
    body = _canonical(manifest)
    expected = "hmac-sha256:" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    if not _same(signature, expected):
        return "its signature does not match this kernel's key"
    return ""


def _canonical(manifest: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k not in (CHECKSUM, SIGNATURE)}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _same(found: str, expected: str) -> bool:
    return hmac.compare_digest(found.encode("utf-8", "replace"), expected.encode())
