"""The SQLite state file (``gateway/books/state/sqlite/file.py``): several stores
on one file in one process, read by other processes meanwhile, keep every commit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from gateway.books.state.sqlite.anchors import SqliteAnchorStore

_READ = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
    "print(sorted(r[0] for r in c.execute('SELECT replica FROM receipt_anchors'))); c.close()"
)


def _read_elsewhere(path: Path) -> str:
    """What another process sees (and what its last close may checkpoint and delete)."""
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_opening_a_live_file_again_loses_no_commit_of_another_process_view(
    tmp_path: Path,
) -> None:
    """Closing any descriptor of a file drops every POSIX lock its process holds
    on it: a second store that opened and closed the live file made another
    process's SQLite think the first store's connection was gone, and its last
    close deleted the WAL the first store went on writing into (found as
    anchors that vanished, issue 36)."""
    path = tmp_path / "catalog.sqlite3"

    async def run() -> None:
        first = SqliteAnchorStore(path)
        await first.anchor("a", 1, "aa", 1e9)
        second = SqliteAnchorStore(path)  # opens the same live file again
        try:
            assert _read_elsewhere(path) == "['a']"
            await first.anchor("b", 2, "bb", 1e9)
            assert _read_elsewhere(path) == "['a', 'b']"
        finally:
            await second.close()
            await first.close()

    asyncio.run(run())
    assert _read_elsewhere(path) == "['a', 'b']"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
