"""Jupyter messages the tests send as a front end would."""

from __future__ import annotations

import uuid
from typing import Any


def execute_request(code: str, *, username: str = "test") -> dict[str, Any]:
    """A notebook's execute_request of ``code`` for a kernel's websocket (``store_history``:
    the cell gets its number); its ``header["msg_id"]`` names the replies."""
    header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": username}
    header.update(session=uuid.uuid4().hex, version="5.3", date="")
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
    content.update(allow_stdin=False, stop_on_error=True)
    request = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell"}
    request.update(content=content, buffers=[])
    return request
