"""Receipts: one JSON line per authenticated inference request (spec §10, §12, §13).

Rules:
- A :class:`Receipt` is filled in as the request goes and written exactly once,
  from the request's one ``finally``.
- Receipts hold digests, sizes, counts and outcomes, never prompt text, media
  bytes, tokens or paths.
- One receipt is one line for every reader (spec §21): :func:`receipt_line`
  escapes U+2028, U+2029 and U+0085, which orjson leaves raw and which
  ``str.splitlines()`` (and JavaScript) split on, and bounds ``subject`` (a
  JWT's ``sub``, the caller's IdP's to choose) at :data:`MAX_SUBJECT_CHARS`,
  lone surrogates (valid in a token's JSON, not in UTF-8) replaced by U+FFFD.

:class:`ReceiptWriter` keeps writes off the event loop and never fails open:

- Lines are queued in memory and a single flusher task appends each batch
  with ``os.write`` on an ``O_APPEND`` descriptor and fsyncs it, in a worker
  thread. One writer means lines never interleave; whole-line appends mean a
  crash can at worst cut the last line, never an earlier one.
- When a write fails (disk full, I/O error, the directory gone) the batch
  stays queued -- what was written of it is remembered, so a line cut by a
  full disk is completed, not repeated -- and the flusher retries with
  backoff (:data:`_BACKOFF_S`) until it works again. The failure is logged
  once per episode with its reason (an errno name, never a path), counted in
  ``gateway_receipt_errors_total``, and :attr:`ReceiptWriter.healthy` is
  False meanwhile: ``/readyz`` is 503 and new inference and evidence requests
  get 503 ``audit_unavailable``. Recovery needs nothing from anyone.
- At most ``max_pending`` receipts wait; one more is counted as lost
  (``gateway_receipts_lost_total``) and logged once per episode: a receipt the
  writer accepted is written or counted, never silently dropped.
- ``rotate_bytes`` rotates the file to ``<path>.1`` … ``<path>.<keep>`` before
  a batch would pass that size; :meth:`ReceiptWriter.reopen` (SIGHUP) reopens
  the path for an external logrotate.
- Each line is a link of this replica's chain (``replica``, ``seq``,
  ``prev_sha256``: gateway/books/receipt_chain.py), stamped as it is queued
  (the queue is the file's order), on through rotations and reopens, and on
  from the file's last line after a restart. A receipt lost past the bound
  still takes its seq, so the chain shows where receipts were lost.
- :meth:`ReceiptWriter.start` takes the path's lock (gateway/books/audit_file.py)
  and holds it until :meth:`ReceiptWriter.aclose`; a second writer on the path
  gets :class:`AuditFileHeld` and writes nothing.
- :meth:`ReceiptWriter.flush` and :meth:`ReceiptWriter.aclose` wait at most
  their timeout (a drain must not hang on a full disk) and report how many
  receipts they could not write.
- **Write-ahead** (spec §24): at admission :meth:`ReceiptWriter.open` queues
  an ``open`` line (``{"kind": "open", "request_id", "replica", "seq",
  "prev_sha256", "tenant", "endpoint", "created"}``), a link of the chain like
  a receipt, and the request's receipt names it (``open_seq``): a replica
  SIGKILLed mid-request leaves its open lines without receipts, which
  ``receipts verify`` reports as ``unfinished``. An open line does not wake
  the flusher: it rides the next batch a receipt starts, so it adds no fsync
  of its own; only one that waited :data:`OPEN_DUE_S` alone (a long request
  and nothing else ending) is written by itself.
- :attr:`ReceiptWriter.durable` is the chain's head on disk (``seq``,
  ``sha256`` of the last line fsynced): what the chain anchors record
  (``gateway/books/anchors.py``), never a line a crash could still take.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import math
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson

from gateway.apis.usage import Usage
from gateway.books import audit_file
from gateway.books.audit_file import AuditFileHeld
from gateway.books.receipt_chain import ChainHead

__all__ = [
    "MAX_SUBJECT_CHARS",
    "AuditFileHeld",
    "Receipt",
    "ReceiptWriter",
    "ReleaseMark",
    "Usage",
    "receipt_line",
]

log = logging.getLogger("gateway.receipts")

#: retry delays while writing fails: doubling from the first, capped at the last
_BACKOFF_S = (0.05, 2.0)
#: bytes per append: bounds one thread hop and keeps rotated files near their bound
_BATCH_BYTES = 1 << 20
#: the longest ``subject`` a receipt keeps, in characters (spec §21)
MAX_SUBJECT_CHARS = 256
#: the longest an open line waits for a receipt's batch to ride before it is
#: written alone (a request killed sooner after its admission leaves no trace)
OPEN_DUE_S = 0.25
#: what orjson writes raw inside strings that some readers take for a line end
#: (U+2028, U+2029, U+0085 in UTF-8), and the JSON escape each becomes. In
#: valid UTF-8 these byte sequences are those characters and nothing else
#: (their lead bytes are never continuation bytes), and orjson writes non-ASCII
#: only inside strings: replacing them leaves a JSON text of the same meaning.
_LINE_BREAKS = (
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
    (b"\xc2\x85", b"\\u0085"),
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class ReleaseMark:
    """Which arm of a release answered (spec §18); ``fallback_from`` names the arm
    whose attempt failed before its head and was sent once to this one."""

    name: str
    arm: str
    fallback_from: str | None = None


@dataclass(slots=True)
class Receipt:
    request_id: str
    tenant: str
    subject: str
    endpoint: str
    serve_identity: str | None
    model_alias: str | None = None
    route: str | None = None
    #: the worker that served the route (spec §16); serve_identity is that worker's
    upstream: str | None = None
    #: the worker's own id of the answer; callers see the gateway's (spec §21)
    upstream_id: str | None = None
    request_sha256: str | None = None
    request_bytes: int | None = None
    artifacts: list[dict[str, str]] = field(default_factory=list)
    locator_sha256: list[str | None] = field(default_factory=list)
    dropped_parts: list[int] = field(default_factory=list)
    max_tokens: int | None = None
    stream: bool | None = None
    outcome: str = "incomplete"
    error_code: str | None = None
    finish_reason: str | None = None
    #: tokens, or what a media answer made (``{"images": n}``, ``{"audio_ms": ms}``)
    usage: Usage | dict[str, int] | None = None
    stream_sha256: str | None = None
    queue_ms: float | None = None
    ttft_ms: float | None = None
    duration_ms: float | None = None
    cancellation: list[str] = field(default_factory=list)
    #: milliseconds per stage (spec §20, gateway/pipeline/timings.py); null: did not run
    timings_ms: dict[str, float | None] = field(default_factory=dict)
    created: float = 0.0
    #: U+0000 characters replaced by U+FFFD in the streamed text (upstream.text_nul)
    nul_replaced: int = 0
    #: the release and arm when the alias names a release (spec §18); null otherwise
    release: ReleaseMark | None = None
    #: what an images or speech answer made (spec §23): ``sha256``, ``bytes`` and
    #: ``width``/``height`` or ``duration_ms`` of each; null for other endpoints
    outputs: list[dict[str, int | str]] | None = None
    #: an agentic request's rounds, tool calls and decisions, files, worker session (spec §22)
    agent: dict[str, Any] | None = None
    #: the seq of this request's ``open`` line (spec §24); null: refused before admission
    open_seq: int | None = None
    #: the replica's chain (gateway/books/receipt_chain.py), stamped by the writer
    replica: str | None = None
    seq: int | None = None
    prev_sha256: str | None = None

    def answered_by(
        self,
        route: str,
        upstream: str,
        serve_identity: str | None,
        release: ReleaseMark | None = None,
    ) -> None:
        """The route, worker and release arm that answer the request: set once
        resolved, and again when a release's fallback moves it (spec §16, §18)."""
        self.route, self.upstream, self.serve_identity = route, upstream, serve_identity
        self.release = release


def receipt_line(receipt: Receipt) -> bytes:
    """The receipt as one JSON line (newline included): ``subject`` bounded (on
    the receipt itself), the line-break characters escaped."""
    subject = receipt.subject
    if len(subject) > MAX_SUBJECT_CHARS or not subject.isascii():
        receipt.subject = _LONE_SURROGATE.sub("\ufffd", subject[:MAX_SUBJECT_CHARS])
    # orjson writes dataclasses natively, fields in declaration order.
    return _escaped(orjson.dumps(receipt)) + b"\n"


def _escaped(line: bytes) -> bytes:
    if not line.isascii():  # one fast pass; most lines are ASCII
        for raw, escaped in _LINE_BREAKS:
            line = line.replace(raw, escaped)
    return line


def _reason(exc: OSError) -> str:
    """An OSError as a word for logs (never its filename)."""
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


class ReceiptWriter:
    def __init__(
        self,
        path: Path,
        *,
        replica: str = "replica",
        max_pending: int = 100_000,
        rotate_bytes: int = 0,
        keep: int = 10,
        linger_s: float = 0.02,
        on_error: Callable[[], None] | None = None,
        on_lost: Callable[[int], None] | None = None,
        on_pending: Callable[[int], None] | None = None,
    ) -> None:
        self._path = path
        self._chain = ChainHead(replica)
        self._lock: int | None = None
        self._max_pending = max_pending
        self._rotate_bytes = rotate_bytes
        self._keep = keep
        self._linger_s = linger_s
        self._on_error = on_error
        self._on_lost = on_lost
        self._on_pending = on_pending
        self._pending: deque[bytes] = deque()
        #: each pending line's chain link (seq, sha256), None for a torn line's end
        self._links: deque[tuple[int, str] | None] = deque()
        #: open lines still to write: (when due, monotonic; their line's number)
        self._opens: deque[tuple[float, int]] = deque()
        self._open_timer: asyncio.TimerHandle | None = None
        #: the last line on disk: (seq, sha256); None before the chain's first
        self.durable: tuple[int, str] | None = None
        #: the last line written, fsynced or not yet
        self._written_link: tuple[int, str] | None = None
        #: bytes of the line at the head of the queue already on disk (a cut write)
        self._head_written = 0
        self._wakeup = asyncio.Event()
        #: set after every batch written: what a flush() waits on
        self._progress = asyncio.Event()
        self._closed = False
        self._reopen = False
        self._fd: int | None = None
        self._size = 0
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._losing = False
        self.written = 0
        #: writes (each followed by one fsync) that put lines on disk
        self.batches = 0
        self.lost = 0
        self.errors = 0

    @property
    def healthy(self) -> bool:
        """False while writing fails (from the first failure to the next success)."""
        return not self._failing

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        """Take the path's lock (:class:`AuditFileHeld`: another writer has it),
        find where the chain left off, open the file."""
        await anyio.to_thread.run_sync(self._start)
        self._task = asyncio.create_task(self._run(), name="receipt-writer")

    def write(self, receipt: Receipt) -> None:
        """Queue one receipt; never blocks the event loop."""
        # Taken before the bound: a lost receipt's seq is the mark it leaves in the chain.
        seq = self._chain.advance()
        if self._full():
            return
        receipt.replica, receipt.seq = self._chain.replica, seq
        receipt.prev_sha256 = self._chain.last_sha256
        self._queue(receipt_line(receipt), seq)
        self._wakeup.set()

    def open(self, receipt: Receipt) -> None:
        """At admission: queue the request's ``open`` line (module docstring) and
        name its seq on the receipt. Never blocks, never wakes the flusher."""
        seq = receipt.open_seq = self._chain.advance()
        if self._full():
            return
        fields = {
            "kind": "open",
            "request_id": receipt.request_id,
            "replica": self._chain.replica,
            "seq": seq,
            "prev_sha256": self._chain.last_sha256,
            "tenant": receipt.tenant,
            "endpoint": receipt.endpoint,
            "created": time.time(),
        }
        # On every request's path: hashed without a copy (the line's bytes before
        # its newline), and no gauge update (the receipt's own comes soon).
        body = _escaped(orjson.dumps(fields))
        sha256 = self._chain.last_sha256 = hashlib.sha256(body).hexdigest()
        self._opens.append((time.monotonic() + OPEN_DUE_S, self.written + len(self._pending)))
        self._pending.append(body + b"\n")
        self._links.append((seq, sha256))
        if self._open_timer is None and self._task is not None:
            self._open_timer = asyncio.get_running_loop().call_later(OPEN_DUE_S, self._open_due)

    def _full(self) -> bool:
        """At the backlog bound: the line (its seq already taken) is counted as lost."""
        if len(self._pending) < self._max_pending:
            return False
        self.lost += 1
        if self._on_lost is not None:
            self._on_lost(1)
        if not self._losing:
            self._losing = True
            log.error(
                "receipts: %d pending, the backlog bound; further receipts are lost "
                "(counted in gateway_receipts_lost_total) until writing catches up",
                len(self._pending),
            )
        return True

    def _queue(self, line: bytes, seq: int) -> None:
        self._chain.link(line)
        self._pending.append(line)
        self._links.append((seq, self._chain.last_sha256 or ""))
        self._changed()

    def _open_due(self) -> None:
        """An open line waited :data:`OPEN_DUE_S` for a batch to ride: write it now."""
        self._open_timer = None
        opens, now = self._opens, time.monotonic()
        woken = False
        while opens and (opens[0][1] < self.written or opens[0][0] <= now):
            if opens[0][1] >= self.written and not woken:
                self._wakeup.set()  # the flusher writes every line pending, this one too
                woken = True
            opens.popleft()
        if opens and not self._closed:
            delay = max(0.0, opens[0][0] - now)
            self._open_timer = asyncio.get_running_loop().call_later(delay, self._open_due)

    def reopen(self) -> None:
        """SIGHUP: reopen the path before the next write (external logrotate)."""
        self._reopen = True
        self._wakeup.set()

    async def flush(self, timeout_s: float | None = None) -> int:
        """Wait until everything queued so far is on disk, at most ``timeout_s``;
        the number of those receipts still not written. Lines queued after the
        call are not waited for: under steady traffic the queue is never empty."""
        if self._task is None:
            return len(self._pending)
        target = self.written + len(self._pending)
        try:
            async with asyncio.timeout(timeout_s):
                while self.written < target:
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            pass
        return max(0, target - self.written)

    async def aclose(self, timeout_s: float | None = None) -> int:
        """Write what is queued (waiting at most ``timeout_s``), then stop; the
        number of receipts that could not be written (logged)."""
        if self._task is None:
            return len(self._pending)
        self._closed = True
        self._wakeup.set()
        if self._open_timer is not None:
            self._open_timer.cancel()
            self._open_timer = None
        task, self._task = self._task, None
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        unwritten = len(self._pending)
        if unwritten:
            log.error("receipts: %d could not be written before shutdown", unwritten)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._unlock()
        return unwritten

    # -- the flusher ------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = _BACKOFF_S[0]
        while True:
            await self._wakeup.wait()
            if not self._closed and not self._failing and self._linger_s:
                # Linger so that a gateway pays one thread hop and one fsync per
                # batch, not per receipt (issue 26's profile: ~10 % of C=1's CPU).
                await asyncio.sleep(self._linger_s)
            self._wakeup.clear()
            # The lines this wakeup is for: ones queued while they are written
            # wait for the next linger, or C=1 went back to a fsync per receipt
            # or two (each fsync outlasting the gap between requests). A
            # backlog over one batch, or a close, is written straight through.
            due = math.inf if self._closed else self.written + len(self._pending)
            while (self._pending and self.written < due) or self._reopen:
                try:
                    # The loop's own executor: anyio's thread hop detects the async
                    # library on every call, which showed in the profile.
                    await loop.run_in_executor(None, self._write_batch)
                except OSError as exc:
                    self._failed(exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _BACKOFF_S[1])
                    continue
                delay = _BACKOFF_S[0]
                self._recovered()
                self._progress.set()
            self._changed()
            if self._closed and not self._pending:
                return

    def _failed(self, exc: OSError) -> None:
        self.errors += 1
        if self._on_error is not None:
            self._on_error()
        if not self._failing:
            self._failing = True
            log.error(
                "receipts: cannot write the audit file (%s); %d pending kept in memory, "
                "retrying; inference and evidence requests get 503 audit_unavailable meanwhile",
                _reason(exc),
                len(self._pending),
            )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.warning("receipts: the audit file is writable again")
        if self._losing and len(self._pending) < self._max_pending:
            self._losing = False

    def _changed(self) -> None:
        if self._on_pending is not None:
            self._on_pending(len(self._pending))

    def _unlock(self) -> None:
        if self._lock is not None:
            audit_file.unlock(self._lock)
            self._lock = None

    # -- in the worker thread ---------------------------------------------------

    def _start(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = audit_file.lock(self._path)
        try:
            # Under the lock: no other writer moves the file's end meanwhile.
            self._chain = ChainHead.resume(self._chain.replica, audit_file.last_line(self._path))
            if self._chain.seq and self._chain.last_sha256 is not None:
                self.durable = self._written_link = (self._chain.seq, self._chain.last_sha256)
            self._open()
            self._end_torn_line()
        except BaseException:
            self._unlock()
            raise

    def _open(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def _write_batch(self) -> None:
        """Append lines from the head of the queue (up to one batch); raises OSError
        with the queue left exactly as far as the disk got."""
        if self._reopen or self._fd is None:
            self._reopen = False
            self._open()
        pending = self._pending
        if not pending:
            return
        lines: list[bytes] = []
        size = 0
        for line in pending:
            if lines and size + len(line) > _BATCH_BYTES:
                break
            lines.append(line)
            size += len(line)
        if (
            self._rotate_bytes
            and self._head_written == 0
            and self._size
            and self._size + size > self._rotate_bytes
        ):
            self._rotate()
        data = memoryview(b"".join(lines))[self._head_written :]
        assert self._fd is not None
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, data[done:])
        finally:
            self._account(lines, done)
        os.fsync(self._fd)
        # On disk now (the fsync covers lines an earlier failed batch wrote too).
        self.durable = self._written_link
        self.batches += 1

    def _account(self, lines: list[bytes], done: int) -> None:
        """Drop the lines ``done`` bytes completed; remember a cut line's progress."""
        self._size += done
        progress = self._head_written + done
        for line in lines:
            if progress < len(line):
                break
            progress -= len(line)
            self._pending.popleft()
            link = self._links.popleft()
            if link is not None:
                self._written_link = link
            self.written += 1
        self._head_written = progress

    def _rotate(self) -> None:
        for index in range(self._keep - 1, 0, -1):
            older = self._path.with_name(f"{self._path.name}.{index}")
            if older.exists():
                os.replace(older, self._path.with_name(f"{self._path.name}.{index + 1}"))
        if self._keep > 0:
            os.replace(self._path, self._path.with_name(f"{self._path.name}.1"))
        else:
            os.unlink(self._path)
        self._open()

    def _end_torn_line(self) -> None:
        """After a crash mid-append, start on a fresh line so the next receipt stays whole."""
        size = self._path.stat().st_size
        if size:
            with self._path.open("rb") as handle:
                handle.seek(size - 1)
                torn = handle.read(1) != b"\n"
            if torn:
                # Ahead of every receipt; written (and retried) like one, not counted as one.
                self._pending.appendleft(b"\n")
                self._links.appendleft(None)
                self.written -= 1
