"""docs/security.md names a test for every control; every name must exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _test_sources() -> dict[str, str]:
    sources: dict[str, str] = {}
    paths = sorted((REPO / "tests").rglob("test_*.py"))
    for path in paths:
        sources[path.stem] = path.read_text()
    # A path relative to tests/ wins over another file's bare stem
    # (test_tracing is tests/test_tracing.py, not integration/test_tracing.py).
    for path in paths:
        sources[path.relative_to(REPO / "tests").with_suffix("").as_posix()] = path.read_text()
    return sources


def test_every_test_named_in_the_threat_model_exists() -> None:
    doc = (REPO / "docs" / "security.md").read_text()
    sources = _test_sources()
    refs = re.findall(r"`([\w/]*)::(test_\w+|\*)`", doc)
    assert len(refs) > 50
    missing = []
    current = ""
    for file, test in refs:
        current = file or current  # "`::test_x`" continues the file named before it
        source = sources.get(current)
        if source is None or (test != "*" and not re.search(rf"def {test}\b", source)):
            missing.append(f"{current}::{test}")
    assert missing == []
    for path in re.findall(r"`(tests/[\w/]+\.py)`", doc):
        assert (REPO / path).is_file(), path
