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
Anthropic ``thinking`` blocks; labelled filler too, each one "token"),
``tool_name`` the name of the ``tool_call`` (None: ``lookup`` on chat, the
request's first tool on Responses and Messages), ``tool_arguments`` its
arguments, a JSON text (constructor and ``set_knobs`` only, like ``text``).

Agentic chat (agents.py; only on a request the worker runs agentically):
``agent`` the tool of each round (agent_plan.py, e.g.
``web:rust,url:https://docs.example.com/a,python,mcp:docs_lookup``),
``agent_permission`` auto|ask|deny (the worker's ``--agent-permission``; the
request's own is combined with it, the strictest wins), ``round_chunks``
content chunks before each tool call, ``files`` files each approved python,
custom or shell round produces, ``file_bytes`` each one's size (over 8 MiB:
elided as the worker does), ``file_mime`` their declared type,
``approval_timeout_s`` how long an approval is waited for (the worker's 300),
``approval_delay_ms`` a pause between the approval event and the wait (a
decision posted in it is ``queued``), ``agent_fault`` (``AGENT_FAULTS``).
Media: ``image_bytes`` pads the PNG to at least this size; ``audio_ms`` the
speech's duration (0: from the input's length), ``audio_bytes`` the speech
body's exact size instead (0: from the duration), ``sample_rate``, ``channels``.

Faults are per dialect. ``FAULTS`` are the chat/completions ones (see
plans.py), ``RESPONSES_FAULTS`` those of ``/v1/responses`` (responses.py),
``EMBEDDINGS_FAULTS`` those of ``/v1/embeddings`` (embeddings.py),
``MESSAGES_FAULTS`` those of ``/v1/messages``, ``COUNT_TOKENS_FAULTS`` those
of ``/v1/messages/count_tokens`` (messages.py), ``IMAGES_FAULTS`` those of
``/v1/images/generations`` (images.py), ``SPEECH_FAULTS`` those of
``/v1/audio/speech`` (speech.py). On an agentic chat request the ``fault``
knob may be any of ``AGENTIC_CHAT_FAULTS`` (it shapes the final answer), and
``agent_fault`` one of ``AGENT_FAULTS`` (agents.py: the violations of the
agentic event order a gateway must catch). A fault that the addressed
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

import orjson

from gateway.testing.simulator.agent_plan import parse_plan

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
IMAGES_FAULTS = frozenset(
    {
        "bad_signature", "bad_crc", "wrong_size", "not_data_url", "bad_base64", "two_images",
        "no_image", "oversize", "close_mid", "hang", "hang_headers", "redirect", "huge_headers",
        "wrong_request_id", "no_request_id", "wrong_content_type", "gzip",
    }
)  # fmt: skip
SPEECH_FAULTS = frozenset(
    {
        "bad_riff", "size_mismatch", "not_pcm", "odd_pcm", "oversize", "close_mid", "hang",
        "hang_headers", "redirect", "huge_headers", "wrong_request_id", "no_request_id",
        "wrong_content_type",
    }
)  # fmt: skip
#: the chat faults an agentic stream takes (they shape its final answer); gzip and
#: json_body would play the run without waiting for approvals
AGENTIC_CHAT_FAULTS = FAULTS - {"gzip", "json_body"}
AGENT_FAULTS = frozenset(
    {
        "unknown_event", "complete_without_calling", "round_regress", "round_over_max",
        "two_approvals", "content_in_round", "end_in_round", "done_in_round", "ran_after_deny",
        "file_outside_round", "oversize_file", "file_bytes_mismatch", "approval_outside_round",
        "stale_approval",
    }
)  # fmt: skip
ALL_FAULTS = (
    FAULTS | RESPONSES_FAULTS | EMBEDDINGS_FAULTS | MESSAGES_FAULTS | COUNT_TOKENS_FAULTS
    | IMAGES_FAULTS | SPEECH_FAULTS
)  # fmt: skip
PERMISSIONS = frozenset({"auto", "ask", "deny"})
#: what a route serves: chat (text inference and, as before kinds, embeddings),
#: embeddings only, image (a diffusion model), speech (a TTS model)
ROUTE_KINDS = frozenset({"chat", "embeddings", "image", "speech"})
_MIME = re.compile(r"[a-z]+/[a-z0-9][a-z0-9.+-]*")
_MIB = 1024 * 1024
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
    tool_name: str | None = None  # the tool_call's name (None: the dialect's default)
    tool_arguments: str = '{"q":1}'  # the tool_call's arguments (a JSON text)
    # agentic chat (agents.py)
    agent: str = ""  # the tool of each round (agent_plan.py)
    agent_permission: str = "auto"  # the worker's --agent-permission
    round_chunks: int = 1
    files: int = 0
    file_bytes: int = 1024
    file_mime: str = "image/png"
    approval_timeout_s: float = 300.0
    approval_delay_ms: float = 0.0
    agent_fault: str | None = None
    # media (images.py, speech.py)
    image_bytes: int = 0
    audio_ms: int = 0
    audio_bytes: int = 0
    sample_rate: int = 44_100
    channels: int = 1

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
            (self.tool_name is None or 0 < len(self.tool_name) <= 256, "tool_name: 1..256 chars"),
            (self.agent_permission in PERMISSIONS, "agent_permission must be auto, ask or deny"),
            (0 <= self.round_chunks <= 1000, "round_chunks must be 0..1000"),
            (0 <= self.files <= 64, "files must be 0..64"),
            (0 <= self.file_bytes <= 64 * _MIB, "file_bytes must be 0..67108864"),
            (_MIME.fullmatch(self.file_mime) is not None, "file_mime must be a MIME type"),
            (0 <= self.approval_timeout_s <= 600, "approval_timeout_s must be 0..600"),
            (0 <= self.approval_delay_ms <= 600_000, "approval_delay_ms must be 0..600000"),
            (self.agent_fault is None or self.agent_fault in AGENT_FAULTS, "unknown agent_fault"),
            (0 <= self.image_bytes <= 64 * _MIB, "image_bytes must be 0..67108864"),
            (0 <= self.audio_ms <= 600_000, "audio_ms must be 0..600000"),
            (0 <= self.audio_bytes <= 256 * _MIB, "audio_bytes must be 0..268435456"),
            (8000 <= self.sample_rate <= 192_000, "sample_rate must be 8000..192000"),
            (1 <= self.channels <= 8, "channels must be 1..8"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        parse_plan(self.agent)  # a bad plan is a ValueError too
        try:
            orjson.loads(self.tool_arguments)
        except orjson.JSONDecodeError as exc:
            raise ValueError("tool_arguments must be a JSON text") from exc


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
    "tool_name": str,
    "agent": str,
    "agent_permission": str,
    "round_chunks": int,
    "files": int,
    "file_bytes": int,
    "file_mime": str,
    "approval_timeout_s": float,
    "approval_delay_ms": float,
    "agent_fault": str,
    "image_bytes": int,
    "audio_ms": int,
    "audio_bytes": int,
    "sample_rate": int,
    "channels": int,
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
