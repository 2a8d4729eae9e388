"""The pure core imports no I/O library (style: "a pure core").

Imported in a fresh interpreter, so nothing else in the test run has loaded
those libraries already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "gateway.core.sse",
    "gateway.core.errors",
    "gateway.core.outcome",
    "gateway.core.body",
    "gateway.config.policy",
    "gateway.apis",
    "gateway.apis.base",
    "gateway.apis.chat",
    "gateway.apis.completions",
    "gateway.apis.chunks",
    "gateway.apis.responses",
    "gateway.apis.response_events",
    "gateway.apis.embeddings",
    "gateway.apis.media",
    "gateway.apis.fields",
    "gateway.apis.usage",
    "gateway.ratelimit.core",
]
IO_LIBRARIES = {"asyncio", "httpx", "httpcore", "starlette", "sqlite3", "anyio", "uvicorn", "redis"}


def test_pure_modules_import_no_io_library() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {PURE!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    loaded = set(json.loads(done.stdout))
    assert "gateway" in loaded
    assert loaded & IO_LIBRARIES == set()
