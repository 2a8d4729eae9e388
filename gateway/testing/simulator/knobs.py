"""Simulator constants, the per-response knobs and ``[[sim ...]]`` directives.

Knobs (constructor defaults, ``set_knobs``, or ``[[sim key=value ...]]``):

``chunks`` text chunks (each one "token"), ``delay_ms`` between chunks,
``first_delay_ms`` before the first, ``keepalive_ms`` idle time before a
keep-alive comment (0: none), ``split`` write the bytes in pieces of at most N,
``unicode`` multi-byte words, ``finish`` stop|length|tool_calls|canceled,
``tool_call`` end in a function call, ``status`` answer this HTTP status with
``{"message":"simulated failure"}``, ``extras`` 0.9.5 extras (chat; embeddings:
cached tokens), ``fault`` (below), ``pad`` pad each token to N bytes, ``terminal``
completed|incomplete|failed (``/v1/responses`` only; the real server only ever
sends ``completed``), ``dims`` embedding dimensions (``/v1/embeddings``),
``text`` the answer's text instead of the labelled filler, cut into ``chunks``
pieces (constructor and ``set_knobs`` only, not a directive: for a caller that
needs a given answer, e.g. JSON for a ``response_format`` schema),
``reasoning`` reasoning chunks before the text (chat ``reasoning_content``,
Anthropic ``thinking`` blocks; labelled filler too, each one "token").

Faults are per dialect. ``FAULTS`` are the chat/completions ones (see
plans.py), ``RESPONSES_FAULTS`` those of ``/v1/responses`` (responses.py),
``EMBEDDINGS_FAULTS`` those of ``/v1/embeddings`` (embeddings.py),
``MESSAGES_FAULTS`` those of ``/v1/messages`` and ``COUNT_TOKENS_FAULTS`` those
of ``/v1/messages/count_tokens`` (messages.py). A fault that the addressed
route does not know answers 400 ``simulator: ...``, like a typo, so a test
never passes on a fault that did nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the route the simulator serves unless told: the one the example configs
#: (fixtures/config/gateway.yaml, the demo, the tests) point at, so that a
#: newcomer's gateway in front of a bare `mistralrs-gateway simulator` is ready
DEFAULT_MODEL_ID = (
    "/srv/mosaic-models/" + hashlib.sha256(b"mistralrs-protocol-simulator").hexdigest()
)
SIMULATOR_HEADER = ("x-simulator", "mistralrs-protocol-simulator")
MAX_BODY_BYTES = 50 * 1024 * 1024
FINISHES = frozenset({"stop", "length", "tool_calls", "canceled"})
FAULTS = frozenset(
    {
        "missing_done", "close_mid", "error_json", "error_raw", "error_first", "id_change",
        "created_change", "model_change", "two_choices", "role_change", "nul_text",
        "usage_early", "bad_usage", "too_many_tokens", "bad_finish", "named_event",
        "after_done", "hang", "hang_headers", "hang_mid", "json_body", "wrong_content_type",
        "huge_headers", "endless_line", "gzip", "redirect", "wrong_request_id",
        "no_request_id", "invalid_utf8",
    }
)  # fmt: skip
RESPONSES_FAULTS = frozenset(
    {
        "missing_done", "close_mid", "error_json", "error_first", "id_change", "named_event",
        "after_done", "bad_usage", "too_many_tokens", "nul_text", "invalid_utf8", "seq_gap",
        "hang", "hang_headers", "hang_mid", "json_body", "wrong_content_type", "gzip",
        "redirect", "wrong_request_id", "no_request_id", "huge_headers", "endless_line",
    }
)  # fmt: skip
EMBEDDINGS_FAULTS = frozenset(
    {
        "wrong_count", "bad_index", "bad_usage", "non_finite", "close_mid", "hang",
        "hang_headers", "wrong_content_type", "gzip", "redirect", "wrong_request_id",
        "no_request_id", "huge_headers",
    }
)  # fmt: skip
MESSAGES_FAULTS = frozenset(
    {
        "missing_stop", "close_mid", "error_event", "error_first", "block_order",
        "index_gap", "unknown_event", "after_stop", "too_many_tokens", "nul_text",
        "invalid_utf8", "hang", "hang_headers", "hang_mid", "json_body", "wrong_content_type",
        "gzip", "redirect", "wrong_request_id", "no_request_id", "huge_headers", "endless_line",
    }
)  # fmt: skip
COUNT_TOKENS_FAULTS = frozenset(
    {
        "bad_body", "bad_count", "extra_field", "close_mid", "hang", "hang_headers",
        "wrong_content_type", "gzip", "redirect", "wrong_request_id", "no_request_id",
        "huge_headers",
    }
)  # fmt: skip
ALL_FAULTS = FAULTS | RESPONSES_FAULTS | EMBEDDINGS_FAULTS | MESSAGES_FAULTS | COUNT_TOKENS_FAULTS
TERMINALS = frozenset({"completed", "incomplete", "failed"})
MODELS_FAULTS = frozenset({"bad_body", "hang"})
MODEL_STATUSES = frozenset({"loaded", "unloaded", "reloading"})


_DIRECTIVE = re.compile(r"\[\[sim(\s[^\]]*)?\]\]")


@dataclass(frozen=True, slots=True)
class SimKnobs:
    """How one response is shaped. Constructor defaults, then per-request directives."""

    chunks: int = 8
    delay_ms: float = 0.0
    first_delay_ms: float = 0.0
    keepalive_ms: float = 10_000.0  # 0 disables keep-alive comments
    split: int = 0  # 0: write whole; N: pieces of at most N bytes, each flushed alone
    unicode: bool = False
    finish: str = "stop"
    tool_call: bool = False
    status: int | None = None
    extras: bool = False
    fault: str | None = None
    pad: int = 0  # pad each content token's text to this many bytes (large streams)
    terminal: str = "completed"  # /v1/responses: the terminal event
    dims: int = 8  # /v1/embeddings: vector length
    text: str | None = None  # the answer's text instead of the filler, cut into `chunks`
    reasoning: int = 0  # reasoning chunks before the text (chat and /v1/messages)

    def __post_init__(self) -> None:
        checks = (
            (0 <= self.chunks <= 100_000, "chunks must be 0..100000"),
            (0 <= self.delay_ms <= 600_000, "delay_ms must be 0..600000"),
            (0 <= self.first_delay_ms <= 600_000, "first_delay_ms must be 0..600000"),
            (0 <= self.keepalive_ms <= 600_000, "keepalive_ms must be 0..600000"),
            (0 <= self.split <= 1 << 20, "split must be 0..1048576"),
            (self.finish in FINISHES, f"finish must be one of {sorted(FINISHES)}"),
            (self.status is None or 100 <= self.status <= 599, "status must be 100..599"),
            (self.fault is None or self.fault in ALL_FAULTS, "unknown fault"),
            (0 <= self.pad <= 65_536, "pad must be 0..65536"),
            (self.terminal in TERMINALS, f"terminal must be one of {sorted(TERMINALS)}"),
            (1 <= self.dims <= 8192, "dims must be 1..8192"),
            (self.text is None or len(self.text) <= 1 << 20, "text must be at most 1 MiB"),
            (0 <= self.reasoning <= 100_000, "reasoning must be 0..100000"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def _flag(raw: str) -> bool:
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 0 or 1")


_KNOB_TYPES: dict[str, Callable[[str], Any]] = {
    "chunks": int,
    "delay_ms": float,
    "first_delay_ms": float,
    "keepalive_ms": float,
    "split": int,
    "unicode": _flag,
    "finish": str,
    "tool_call": _flag,
    "status": int,
    "extras": _flag,
    "fault": str,
    "pad": int,
    "terminal": str,
    "dims": int,
    "reasoning": int,
}


class DirectiveError(ValueError):
    """A ``[[sim ...]]`` directive the simulator cannot honour."""


def apply_directives(text: str, base: SimKnobs) -> SimKnobs:
    """Override ``base`` with every ``[[sim key=value ...]]`` in ``text`` (later wins)."""
    updates: dict[str, Any] = {}
    for match in _DIRECTIVE.finditer(text):
        for item in (match.group(1) or "").split():
            key, sep, raw = item.partition("=")
            convert = _KNOB_TYPES.get(key)
            if convert is None or not sep:
                raise DirectiveError(f"simulator: unknown directive {item!r}")
            try:
                updates[key] = convert(raw)
            except ValueError as exc:
                raise DirectiveError(f"simulator: bad value in {item!r}") from exc
    if not updates:
        return base
    try:
        return dataclasses.replace(base, **updates)
    except ValueError as exc:
        raise DirectiveError(f"simulator: {exc}") from exc


def check_fault(knobs: SimKnobs, known: frozenset[str], path: str) -> None:
    """Refuse a fault that ``path`` does not implement (a no-op fault would hide a bug)."""
    if knobs.fault is not None and knobs.fault not in known:
        raise DirectiveError(f"simulator: fault {knobs.fault!r} does not apply to {path}")
