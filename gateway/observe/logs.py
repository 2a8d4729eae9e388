"""Structured JSON logging: one object per line, fixed keys, no request content.

Callers pass only identifiers, codes, counts and durations in ``extra``; the
formatter copies just the keys in ``_FIELDS``, so an accidental ``extra``
cannot leak a prompt or token into the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable

import orjson

_FIELDS = (
    "request_id",
    "tenant",
    "route",
    "method",
    "status",
    "outcome",
    "error_code",
    "reason",
    "duration_ms",
)


def _ts(created: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        + f".{int((created % 1) * 1000):03d}Z"
    )


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _FIELDS:
            # A key passed in ``extra`` is kept even when null, so that every
            # access line has the same keys (e.g. ``outcome`` of a 401).
            if name in record.__dict__:
                entry[name] = record.__dict__[name]
        if record.exc_info and record.exc_info[0] is not None:
            # The type only: exception text can carry request data.
            entry["exc_type"] = record.exc_info[0].__name__
        return orjson.dumps(entry).decode()


class JsonLinesHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Every record as one JSON line on stderr; access lines held briefly.

    The access line (one per request) skips the logging machinery (a record,
    its handlers, a write and a flush each: ~10 % of a streamed request's
    CPU in issue 26's profile): :meth:`access` formats it with the same keys
    and holds it, and the lines held go out together, at most
    :attr:`HOLD_S` later, after :attr:`HOLD_LINES` lines, or before any other
    record, so the order of lines on stderr is the order they were made. A
    held line reaches stderr at exit too (``logging.shutdown`` flushes).
    """

    HOLD_S = 0.1
    HOLD_LINES = 64

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self._held: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    def access(self, fields: dict[str, object]) -> None:
        """The access line of one request (on the event loop's thread)."""
        entry: dict[str, object] = {
            "ts": _ts(time.time()),
            "level": "info",
            "logger": "gateway.access",
            "msg": "request",
        }
        for name in _FIELDS:  # as the formatter does: no key beyond these
            if name in fields:
                entry[name] = fields[name]
        line = orjson.dumps(entry)
        with self.lock:  # type: ignore[union-attr]
            self._held.append(line)
            if len(self._held) >= self.HOLD_LINES:
                self._write_held()
            elif self._timer is None or self._timer.cancelled():
                # (cancelled: its loop closed before it fired, as a test's loop does)
                self._timer = asyncio.get_running_loop().call_later(self.HOLD_S, self._on_timer)

    def _on_timer(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._timer = None
            self._write_held()

    def emit(self, record: logging.LogRecord) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_held()
        super().emit(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_held()
        super().flush()

    def _write_held(self) -> None:
        # The timer is never cancelled here: records come from any thread
        # (exporters, executors), and a loop's timer is the loop's thread's to
        # touch. Left to fire, it finds nothing held, or the lines since.
        if self._held:
            held, self._held = self._held, []
            try:
                self.stream.write(b"\n".join(held).decode() + "\n")
                self.stream.flush()
            except OSError:
                # stderr gone (EPIPE): there is nowhere to say so, and a
                # request must not fail over its access line.
                pass


def access_writer(logger: logging.Logger) -> Callable[[dict[str, object]], None]:
    """Where the app writes access lines: the JSON-lines handler's holder when
    ``setup_logging`` installed it, else ``logger`` (in-process tests)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, JsonLinesHandler):
            return handler.access
    return lambda fields: logger.info("request", extra=fields)


def setup_logging(level: str) -> None:
    """Level from GATEWAY_LOG_LEVEL when set, else from config."""
    chosen = os.environ.get("GATEWAY_LOG_LEVEL", level).upper()
    handler = JsonLinesHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(chosen if chosen in logging.getLevelNamesMapping() else "INFO")
    # uvicorn's own access log would duplicate ours (and log raw paths).
    logging.getLogger("uvicorn.access").disabled = True
    # httpx logs every worker call at INFO (a readiness poll every few seconds,
    # a second line per request); its warnings and errors still come through.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # The formatter reads none of these, and collecting them (a stack walk for
    # the caller, thread and process lookups) was most of the cost of the
    # access line in the profile. Logging HOWTO, "Optimization".
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
