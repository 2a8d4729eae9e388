"""The build's clean-up (gateway/tools/build_native.py) finds every extension module."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

from gateway.tools import build_native


def test_every_extension_in_the_tree_is_found_not_only_the_listed_ones(tmp_path: Path) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    listed = tmp_path / "gateway" / "core" / ("sse" + suffix)
    # left by a build of a longer list: imported in place of its .py if kept
    stray = tmp_path / "gateway" / "admission" / ("core" + suffix)
    group = tmp_path / "gateway" / ("_native__mypyc" + suffix)
    source = tmp_path / "gateway" / "admission" / "core.py"
    for path in (listed, stray, group, source):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    assert build_native._extensions(tmp_path) == sorted([listed, stray, group])
