"""What a serving gateway imports: httpx (with httpcore, and rich and pygments
where they are installed) only when an issuer fetches its keys from a
``jwks_url``. The worker's small exchanges have their own wire pool; the
import cost ~5-7 MB of every replica's RSS (docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.imports import top_level_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_serving_gateway_imports_no_httpx() -> None:
    loaded = top_level_imports(["gateway.tools.cli", "gateway.http.server", "gateway.http.app"])
    assert "uvicorn" in loaded and "gateway" in loaded
    assert loaded & {"httpx", "httpcore", "rich", "pygments"} == set()


def test_a_jwks_url_client_brings_httpx() -> None:
    script = (
        "import sys\n"
        "from gateway.auth.keys import jwks_client\n"
        "assert 'httpx' not in sys.modules\n"
        "client = jwks_client()\n"
        "print(type(client).__module__.split('.')[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    assert done.stdout.strip() == b"httpx"
