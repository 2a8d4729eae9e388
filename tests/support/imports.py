"""What importing some modules really loads, asked of a fresh interpreter (so
that nothing else in the test run has loaded it already)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def top_level_imports(modules: Iterable[str]) -> set[str]:
    """The top-level names of every module loaded by importing ``modules``."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    return set(json.loads(done.stdout))
