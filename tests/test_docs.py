"""docs/security.md names a test for every control; every name must exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _test_sources() -> dict[str, str]:
    """Test file name (relative to tests/, or a bare stem) -> the sources of
    every file it may name (a stem may name several: test_admission)."""
    sources: dict[str, str] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        text = path.read_text()
        relative = path.relative_to(REPO / "tests").with_suffix("").as_posix()
        sources[relative] = sources.get(relative, "") + text
        if relative != path.stem:
            sources[path.stem] = sources.get(path.stem, "") + text
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
