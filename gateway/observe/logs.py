"""Structured JSON logging: one object per line, fixed keys, no request content.

Callers pass only identifiers, codes, counts and durations in ``extra``; the
formatter copies just the keys in ``_FIELDS``, so an accidental ``extra``
cannot leak a prompt or token into the log.
"""

from __future__ import annotations

import logging
import os
import sys
import time

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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
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


def setup_logging(level: str) -> None:
    """Level from GATEWAY_LOG_LEVEL when set, else from config."""
    chosen = os.environ.get("GATEWAY_LOG_LEVEL", level).upper()
    handler = logging.StreamHandler(sys.stderr)
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
