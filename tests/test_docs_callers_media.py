"""docs/callers.md's one-liner that makes the media files its examples read
works as written: run from an empty directory with this venv's ``python``,
it writes exactly the files the examples name (the ones
``tests/test_docs_callers.py`` gives them), byte for byte the shipped samples."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gateway.testing.samples import SAMPLES
from tests.support.docblocks import blocks, reader_env
from tests.test_docs_callers import DOC, FILES

_MAKER = [b for b in blocks(DOC) if "gateway.testing.samples" in b.code]


def test_the_guide_says_how_to_make_the_media_files() -> None:
    [block] = _MAKER
    # not a block the caller tests execute (those read only the two variables)
    assert block.lang == "text"
    assert block.code.startswith("python -c ")


def test_the_one_liner_writes_the_files_the_examples_read(tmp_path: Path) -> None:
    [block] = _MAKER
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=tmp_path,
        env=reader_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(written) == set(FILES)
    for name, data in written.items():
        assert data == FILES[name]() == SAMPLES["tiny" + Path(name).suffix](), name


def test_the_examples_read_no_other_media_file() -> None:
    named = {
        m
        for b in blocks(DOC)
        if b.lang in ("python", "sh")
        for m in re.findall(r"[\w-]+\.(?:png|wav|mp4|jpg|jpeg|webp|gif|mp3|flac|ogg|mov)\b", b.code)
    }
    assert named == set(FILES)
