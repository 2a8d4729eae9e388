"""A small real filesystem that tests can fill and free (tmpfs; needs root, as CI has).

Used for the "disk full" paths: receipts that cannot be written, evidence
deleted on a full staging volume. Filling is a real file written until the
kernel answers ENOSPC; freeing is deleting it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

_FILLER = ".filler"


@contextlib.contextmanager
def small_fs(path: Path, size_kib: int = 512) -> Iterator[Path]:
    """Mount a tmpfs of ``size_kib`` at ``path`` for the duration."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.fail(
            "a small tmpfs is needed for disk-full tests (run as root, as CI does): "
            + mounted.stderr.decode(errors="replace").strip()
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path) -> Path:
    """Write a file on ``path``'s filesystem until it is full; return the file."""
    filler = path / _FILLER
    block = b"\0" * 4096
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(1 << 20):  # bounded: 4 GiB at most
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                # A last partial page may still take a few bytes.
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * 64):
                        pass
                return filler
        raise AssertionError("the filesystem never filled")
    finally:
        os.close(fd)


def free(path: Path) -> None:
    (path / _FILLER).unlink()
