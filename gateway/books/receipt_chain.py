"""Receipt chains: what ties one replica's receipts together, and how a fleet's
audit files are checked (spec §10, §13, §17).

Rules:
- Every receipt line carries ``replica`` (``state.replica_id``, default
  ``<hostname>-<pid>``), ``seq`` (1, 2, 3 … per replica, on through rotations,
  and on through a restart that finds the replica's last line at the end of its
  file) and ``prev_sha256``: the hex SHA-256 of the replica's previous line,
  its exact bytes without the newline (null at seq 1). One replica's lines are
  a hash chain.
- A receipt the writer drops (past ``audit.max_pending``, counted in
  ``gateway_receipts_lost_total``) still takes its seq: the next line's seq
  skips while its ``prev_sha256`` links to the line before, so a check tells
  receipts the gateway *lost* (and counted) from lines *missing* from the files.
- A check reports gaps (missing seqs, a ``prev_sha256`` that is not the hash of
  the line before), forks (two different lines with one replica and seq, or
  following one line), torn lines (not a JSON object, or a file's last line
  without its newline) and malformed ones (a chain field of the wrong type).
  Byte-identical lines are one receipt (a file given twice, a copy beside it).
  A chain whose oldest line here is past seq 1 is not a finding: rotation
  (``audit.keep``) removes a chain's oldest files by design.

- Write-ahead (spec §24): an ``open`` line (``"kind": "open"``) is a link of
  the chain written at admission; the request's receipt names its seq
  (``open_seq``). An open line of a replica that no receipt of that replica
  names is ``unfinished``: the request was admitted and never ended in a
  receipt (its replica was killed, or the receipt was lost).
- Anchors (spec §24): each replica records its chain head on disk (``seq``,
  ``sha256``) in the state store every ``audit.anchor_interval_s``. A chain
  whose newest line here is below its anchor's seq is ``truncated`` (lines
  were deleted from its end, which no link can show); a line at the anchor's
  seq that is not the anchored one is a ``gap`` (changed or replaced).

Pure: bytes and entries in, entries and findings out; the writer and the
``receipts`` CLI do the file I/O.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import orjson

__all__ = [
    "Anchor",
    "ChainHead",
    "Entry",
    "Finding",
    "Report",
    "check",
    "last_receipt",
    "line_sha256",
    "read_line",
]

Kind = Literal["gap", "lost", "fork", "torn", "malformed", "unfinished", "truncated"]


def line_sha256(line: bytes) -> str:
    """The hash a following line names: of the line's bytes without its newline."""
    return hashlib.sha256(line.removesuffix(b"\n")).hexdigest()


def _object(line: bytes) -> dict[str, object] | None:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(slots=True)
class ChainHead:
    """Where one replica's chain stands: the writer's state."""

    replica: str
    seq: int = 0
    last_sha256: str | None = None

    @classmethod
    def resume(cls, replica: str, last_line: bytes | None) -> ChainHead:
        """Go on from the last receipt in the file if it is this replica's; else a new chain."""
        head = cls(replica)
        receipt = _object(last_line) if last_line is not None else None
        if receipt is not None and receipt.get("replica") == replica:
            seq = receipt.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
                head.seq = seq
                head.last_sha256 = line_sha256(last_line or b"")
        return head

    def advance(self) -> int:
        """The next seq, taken (also by a receipt that is then lost)."""
        self.seq += 1
        return self.seq

    def link(self, line: bytes) -> None:
        """``line`` was queued: the next one names it."""
        self.last_sha256 = line_sha256(line)


def last_receipt(tail: bytes, *, whole: bool) -> bytes | None:
    """The last line of ``tail`` (a file's last bytes; ``whole``: the file's
    every byte) that is a JSON object, without its newline. A final line
    without a newline counts when it parses: a crash cut it just before the
    newline, which the writer then adds. None: none within ``tail``."""
    lines = tail.split(b"\n")
    first = 0 if whole else 1  # a window's first piece may be the end of a longer line
    for line in reversed(lines[first:]):
        if line.strip() and _object(line) is not None:
            return line
    return None


@dataclass(frozen=True, slots=True)
class Entry:
    """One receipt line of an audit file, as a check and a merge need it."""

    source: int  #: index of the file in the caller's list
    line_no: int
    offset: int
    length: int  #: bytes without the newline
    sha256: str
    created: float
    replica: str | None = None
    seq: int | None = None
    prev_sha256: str | None = None
    #: an ``open`` line's request (write-ahead, spec §24); None for a receipt
    opens: str | None = None
    #: the seq of the open line a receipt closes (``open_seq``)
    open_seq: int | None = None


@dataclass(frozen=True, slots=True)
class Anchor:
    """A replica's chain head on disk as it last recorded it (spec §24)."""

    replica: str
    seq: int
    sha256: str
    #: unix seconds of the recording
    updated: float


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Kind
    text: str


def read_line(
    source: int, line_no: int, offset: int, raw: bytes, where: str
) -> tuple[Entry | None, Finding | None]:
    """One line as read (``raw``: its newline included, if it had one): its
    entry, and what is wrong with it. ``where`` names the line in findings."""
    line = raw.removesuffix(b"\n")
    cut = None if raw.endswith(b"\n") else Finding("torn", f"torn: {where}: no newline at the end")
    receipt = _object(line)
    if receipt is None:
        return None, cut or Finding("torn", f"torn: {where}: not a JSON object")
    created = receipt.get("created")
    entry = Entry(
        source,
        line_no,
        offset,
        len(line),
        line_sha256(line),
        float(created) if isinstance(created, int | float) else 0.0,
    )
    replica, seq, prev = receipt.get("replica"), receipt.get("seq"), receipt.get("prev_sha256")
    if replica is None and seq is None and prev is None:
        return entry, cut  # written before receipts carried a chain
    if (
        not isinstance(replica, str)
        or not isinstance(seq, int)
        or isinstance(seq, bool)
        or seq < 1
        or not (prev is None or isinstance(prev, str))
    ):
        return entry, cut or Finding(
            "malformed", f"malformed: {where}: replica, seq or prev_sha256 of the wrong type"
        )
    opens, open_seq = None, receipt.get("open_seq")
    if receipt.get("kind") == "open":
        request_id = receipt.get("request_id")
        opens = request_id if isinstance(request_id, str) else ""
    if not (open_seq is None or (isinstance(open_seq, int) and not isinstance(open_seq, bool))):
        open_seq = None
    return replace(
        entry, replica=replica, seq=seq, prev_sha256=prev, opens=opens, open_seq=open_seq
    ), cut


@dataclass(slots=True)
class Report:
    findings: list[Finding] = field(default_factory=list)
    replicas: int = 0
    receipts: int = 0
    #: lines without chain fields (written before receipts carried one): not checked
    unchained: int = 0
    #: byte-identical copies of a line, counted once
    copies: int = 0
    #: chains whose oldest line here is past seq 1 (older files not given, or rotated away)
    partial: int = 0
    #: open lines (write-ahead), and those no receipt closes (also in findings)
    opens: int = 0
    unfinished: int = 0
    #: anchored replicas with no line in the files given (not a finding: a check of
    #: some replicas' directories only)
    anchored_absent: int = 0


def check(
    entries: Iterable[Entry], where: list[str], anchors: Mapping[str, Anchor] | None = None
) -> Report:
    """Every replica's chain checked; ``where[entry.source]`` names an entry's file;
    ``anchors`` (by replica), when given, are held against each chain's end."""
    report = Report()
    chains: dict[str, dict[int, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    seen: set[str] = set()
    for entry in entries:
        if entry.sha256 in seen:
            report.copies += 1
            continue
        seen.add(entry.sha256)
        if entry.opens is not None:
            report.opens += 1
        else:
            report.receipts += 1
        if entry.replica is None or entry.seq is None:
            report.unchained += 1
        else:
            chains[entry.replica][entry.seq].append(entry)
    report.replicas = len(chains)
    for replica in sorted(chains):
        _check_chain(replica, chains[replica], where, report)
        report.findings += _unfinished(replica, chains[replica], where, report)
    for replica, anchor in sorted((anchors or {}).items()):
        if replica not in chains:
            report.anchored_absent += 1
            continue
        report.findings += _against_anchor(replica, chains[replica], anchor, where)
    return report


def _unfinished(
    replica: str, by_seq: dict[int, list[Entry]], where: list[str], report: Report
) -> list[Finding]:
    """Open lines of the replica that none of its receipts names."""
    closed = {e.open_seq for lines in by_seq.values() for e in lines if e.opens is None}
    found = []
    for seq in sorted(by_seq):
        for entry in by_seq[seq]:
            if entry.opens is not None and seq not in closed:
                report.unfinished += 1
                text = (
                    f"unfinished: replica {replica} seq {seq} ({_at(entry, where)}): request "
                    f"{entry.opens or '?'} was admitted and has no receipt"
                )
                found.append(Finding("unfinished", text))
    return found


def _against_anchor(
    replica: str, by_seq: dict[int, list[Entry]], anchor: Anchor, where: list[str]
) -> list[Finding]:
    newest = max(by_seq)
    if newest < anchor.seq:
        text = (
            f"truncated: replica {replica}: the newest line here is seq {newest}, but the "
            f"replica anchored seq {anchor.seq} at {_iso(anchor.updated)}: "
            f"{anchor.seq - newest} lines are gone from its end"
        )
        return [Finding("truncated", text)]
    lines = by_seq.get(anchor.seq, [])
    if lines and all(e.sha256 != anchor.sha256 for e in lines):
        text = (
            f"gap: replica {replica} seq {anchor.seq} ({_at(lines[0], where)}): not the line "
            "its anchor names (a line was changed or replaced)"
        )
        return [Finding("gap", text)]
    return []


def _iso(unix_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(unix_s, datetime.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _at(entry: Entry, where: list[str]) -> str:
    return f"{where[entry.source]} line {entry.line_no}"


def _check_chain(
    replica: str, by_seq: dict[int, list[Entry]], where: list[str], report: Report
) -> None:
    name = f"replica {replica}"
    seqs = sorted(by_seq)
    if seqs[0] > 1:
        report.partial += 1
    report.findings += _forks(name, seqs, by_seq, where)
    for entry in by_seq[seqs[0]] if seqs[0] == 1 else ():
        if entry.prev_sha256 is not None:
            text = f"gap: {name} seq 1 ({_at(entry, where)}) names a previous line"
            report.findings.append(Finding("gap", text))
    for before, seq in itertools.pairwise(seqs):
        report.findings += _link(name, before, seq, by_seq, where)


def _forks(
    name: str, seqs: list[int], by_seq: dict[int, list[Entry]], where: list[str]
) -> list[Finding]:
    """Different lines at one seq, and lines of different seqs after one line."""
    found = []
    following: dict[str, list[Entry]] = defaultdict(list)
    for seq in seqs:
        lines = by_seq[seq]
        if len(lines) > 1:
            places = ", ".join(_at(e, where) for e in lines)
            text = f"fork: {name} seq {seq}: {len(lines)} different lines ({places})"
            found.append(Finding("fork", text))
        for entry in lines:
            if entry.prev_sha256 is not None:
                following[entry.prev_sha256].append(entry)
    for prev, lines in following.items():
        if len({e.seq for e in lines}) > 1:  # one seq twice is reported above
            places = ", ".join(f"seq {e.seq} ({_at(e, where)})" for e in lines)
            found.append(Finding("fork", f"fork: {name}: {places} follow one line ({prev[:12]})"))
    return found


def _link(
    name: str, before: int, seq: int, by_seq: dict[int, list[Entry]], where: list[str]
) -> list[Finding]:
    """What is wrong between two seqs that follow each other here."""
    hashes = {e.sha256 for e in by_seq[before]}
    if seq == before + 1:
        return [
            Finding(
                "gap",
                f"gap: {name} seq {seq} ({_at(e, where)}): prev_sha256 is not the hash of "
                f"seq {before} (a line was changed or replaced)",
            )
            for e in by_seq[seq]
            if e.prev_sha256 not in hashes
        ]
    missing = f"seq {before + 1}" if seq == before + 2 else f"seq {before + 1}..{seq - 1}"
    if all(e.prev_sha256 in hashes for e in by_seq[seq]):
        # The writer took these seqs for receipts it could not keep (see above).
        text = (
            f"lost: {name} {missing}: {seq - before - 1} receipts the writer dropped "
            "(the chain links across them; counted in gateway_receipts_lost_total)"
        )
        return [Finding("lost", text)]
    return [Finding("gap", f"gap: {name} {missing} missing")]
