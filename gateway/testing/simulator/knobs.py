"""Simulator constants, the per-response knobs and ``[[sim ...]]`` directives."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_MODEL_ID = "/srv/mosaic-models/" + "0" * 64
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

    def __post_init__(self) -> None:
        checks = (
            (0 <= self.chunks <= 100_000, "chunks must be 0..100000"),
            (0 <= self.delay_ms <= 600_000, "delay_ms must be 0..600000"),
            (0 <= self.first_delay_ms <= 600_000, "first_delay_ms must be 0..600000"),
            (0 <= self.keepalive_ms <= 600_000, "keepalive_ms must be 0..600000"),
            (0 <= self.split <= 1 << 20, "split must be 0..1048576"),
            (self.finish in FINISHES, f"finish must be one of {sorted(FINISHES)}"),
            (self.status is None or 100 <= self.status <= 599, "status must be 100..599"),
            (self.fault is None or self.fault in FAULTS, "unknown fault"),
            (0 <= self.pad <= 65_536, "pad must be 0..65536"),
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
