"""The audit file's guards at start (spec §13, §17): one writer per path, and
where its chain left off.

- :func:`lock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<path>.lock``
  beside the audit file, for the writer's life. The lock file, not the audit
  file: a rotation renames the audit file (and its inode with its lock), the
  lock file stays. A second writer on the path, in this process or another
  (also on another host, where the volume's flock reaches it), gets
  :class:`AuditFileHeld` instead of writing into, or rotating away, the first
  one's file.
- :func:`last_line` reads the file's last receipt backwards from the end (a
  window that doubles until it finds one), falling back to ``<path>.1`` when
  the file holds none yet: a rotation moved the chain's tail there.

Messages name no path (spec §13: no log line does).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from gateway.books.receipt_chain import last_receipt

__all__ = ["AuditFileHeld", "last_line", "lock", "lock_path", "unlock"]

#: the first window read from the end of a file; doubled while it holds no whole receipt
_TAIL_BYTES = 64 * 1024


class AuditFileHeld(Exception):
    """Another writer holds the audit file's lock: this one must not start."""

    def __init__(self) -> None:
        # The config key it conflicts on, never the path (spec §24).
        super().__init__("audit.path: the audit file is held by another gateway process")


def lock_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.lock")


def lock(path: Path) -> int:
    """The descriptor holding the audit file's lock (close it to let go);
    :class:`AuditFileHeld` when another writer holds it."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise AuditFileHeld() from None
        raise
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def last_line(path: Path) -> bytes | None:
    """The last receipt line of the audit file (or of ``<path>.1`` when the
    file holds none), without its newline; None: a new file."""
    for candidate in (path, path.with_name(f"{path.name}.1")):
        line = _last_in(candidate)
        if line is not None:
            return line
    return None


def _last_in(path: Path) -> bytes | None:
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        window = _TAIL_BYTES
        while True:
            start = max(0, size - window)
            handle.seek(start)
            line = last_receipt(handle.read(size - start), whole=start == 0)
            if line is not None or start == 0:
                return line
            window *= 2
