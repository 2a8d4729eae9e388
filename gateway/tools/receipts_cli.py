"""``mistralrs-gateway receipts verify|merge PATH…``: a fleet's audit files as one.

Each PATH is a directory, whose audit files are read (``*.jsonl`` and the
rotated ``*.jsonl.<N>``; lock files and anything else left alone), or a file,
read whatever its name. The chain checks are gateway/books/receipt_chain.py.

- ``verify`` prints one line per finding, then a summary; exit 0 when every
  chain is whole, 1 when anything was found, 2 when a PATH could not be read
  or holds no audit file. An ``open`` line (write-ahead, spec §24) no
  receipt names is ``unfinished``: a finding, unless ``--allow-unfinished``
  (a live file's requests in flight), which still prints them. With
  ``--anchors --config F`` each replica's chain is held against the anchor
  it recorded in the state store F names: a chain ending before it is
  ``truncated`` (exit 2 when the store cannot be read).
- ``merge`` prints every receipt line, its original bytes, ordered by
  ``created``, then replica, then seq; byte-identical copies once, torn lines
  left out (counted on stderr: ``verify`` names them). Exit 0, or 2 as above.

Both read each file once, keeping per line only what the order needs (not
the line): ``merge`` reads the lines back by offset.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gateway.books.receipt_chain import Anchor, Entry, Finding, check, read_line

if TYPE_CHECKING:
    from gateway.config import GatewayConfig

__all__ = ["merge", "verify"]

#: an audit file in a directory: the live file and what rotation renamed it to
_AUDIT_NAME = re.compile(r".+\.jsonl(\.[0-9]+)?")


class _Unreadable(Exception):
    pass


def audit_files(paths: list[Path]) -> list[Path]:
    """The files to read, each once (a file named twice, or through a link)."""
    found: dict[Path, Path] = {}
    for path in paths:
        if path.is_dir():
            named = sorted(p for p in path.iterdir() if _AUDIT_NAME.fullmatch(p.name))
            files = [p for p in named if p.is_file()]
            if not files:
                raise _Unreadable(f"{path}: no audit files (*.jsonl, *.jsonl.<N>)")
        elif path.is_file():
            files = [path]
        else:
            raise _Unreadable(f"{path}: no such file or directory")
        for file in files:
            found.setdefault(file.resolve(), file)
    return list(found.values())


def _lines(handle: BinaryIO) -> Iterator[tuple[int, int, bytes]]:
    offset = 0
    for number, raw in enumerate(handle, 1):
        yield number, offset, raw
        offset += len(raw)


@dataclass
class _Read:
    files: list[Path]
    entries: list[Entry] = field(default_factory=list)
    #: torn and malformed lines, in file order
    findings: list[Finding] = field(default_factory=list)
    #: lines that are no receipt at all (not a JSON object)
    unparsed: int = 0


def _scan(files: list[Path]) -> _Read:
    read = _Read(files)
    for index, file in enumerate(files):
        try:
            with file.open("rb") as handle:
                for number, offset, raw in _lines(handle):
                    entry, finding = read_line(index, number, offset, raw, f"{file} line {number}")
                    if entry is None:
                        read.unparsed += 1
                    else:
                        read.entries.append(entry)
                    if finding is not None:
                        read.findings.append(finding)
        except OSError as exc:
            raise _Unreadable(f"{file}: cannot read ({type(exc).__name__})") from exc
    return read


def _read(paths: list[str]) -> _Read | None:
    try:
        return _scan(audit_files([Path(p) for p in paths]))
    except _Unreadable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def verify(paths: list[str], *, allow_unfinished: bool = False, config: str | None = None) -> int:
    """``config``: hold the chains against the anchors in its state store."""
    anchors = None
    if config is not None:
        anchors = _anchors(config)
        if anchors is None:
            return 2
    read = _read(paths)
    if read is None:
        return 2
    report = check(read.entries, [str(f) for f in read.files], anchors)
    findings = read.findings + report.findings
    for finding in findings:
        print(finding.text)
    notes = [
        f"{n} {what}"
        for n, what in (
            (report.opens, "open lines (write-ahead)"),
            (report.partial, "chains start past seq 1 (older files not given or rotated away)"),
            (report.unchained, "receipts without a chain (written before receipts had one)"),
            (report.copies, "identical copies counted once"),
            (report.anchored_absent, "anchored replicas with no line in the files given"),
        )
        if n
    ]
    if anchors is not None:
        notes.append(f"held against {len(anchors)} anchors")
    print(
        f"receipts verify: {len(read.files)} files, {report.replicas} replicas, "
        f"{report.receipts} receipts, {len(findings)} findings"
        + "".join(f"; {note}" for note in notes)
    )
    failing = [f for f in findings if not (allow_unfinished and f.kind == "unfinished")]
    return 1 if failing else 0


def _anchors(config_path: str) -> dict[str, Anchor] | None:
    """The anchors in the state store the config names; None (said on stderr) when
    the config or the store cannot be read. Never prints the DSN."""
    # Imported here: merge and a verify without anchors need no config nor driver.
    from gateway.books.state.factory import open_state
    from gateway.config.loader import ConfigError, load_config
    from gateway.core.errors import GatewayError

    async def read(config: GatewayConfig) -> dict[str, Anchor]:
        state = open_state(config, os.environ)
        try:
            return await state.anchors.anchors()
        finally:
            await state.close()

    try:
        return asyncio.run(read(load_config(Path(config_path))))
    except ConfigError as exc:
        for line in exc.errors:
            print(f"error: {line}", file=sys.stderr)
    except GatewayError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
    return None


def merge(paths: list[str]) -> int:
    read = _read(paths)
    if read is None:
        return 2
    seen: set[str] = set()
    unique = []
    for entry in read.entries:
        if entry.sha256 not in seen:
            seen.add(entry.sha256)
            unique.append(entry)
    unique.sort(key=lambda e: (e.created, e.replica or "", e.seq or 0, e.source, e.offset))
    out = sys.stdout.buffer
    handles: dict[int, BinaryIO] = {}
    try:
        for entry in unique:
            handle = handles.get(entry.source)
            if handle is None:
                handle = handles[entry.source] = read.files[entry.source].open("rb")
            handle.seek(entry.offset)
            out.write(handle.read(entry.length) + b"\n")
    except OSError as exc:
        print(f"error: cannot read back a line ({type(exc).__name__})", file=sys.stderr)
        return 2
    finally:
        for handle in handles.values():
            handle.close()
    out.flush()
    if read.unparsed:
        print(
            f"receipts merge: {read.unparsed} torn lines left out (receipts verify names them)",
            file=sys.stderr,
        )
    return 0
