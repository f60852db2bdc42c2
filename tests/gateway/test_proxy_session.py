"""The Enterprise Gateway proxy over its kernel session on the scripted FakeBackend, with no
gateway, cluster or kernel: `proxy_on_fake.py` runs in EG's own environment (`.venv-eg`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.gateway.gateways import enterprise_gateway_python


def test_the_proxy_launches_restarts_in_place_kills_and_fails_clearly_on_a_fake_backend() -> None:
    script = Path(__file__).with_name("proxy_on_fake.py")
    done = subprocess.run(
        [str(enterprise_gateway_python()), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
