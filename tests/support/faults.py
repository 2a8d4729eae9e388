"""The simulator's chat stream faults and what the gateway must make of each
(spec §8, §12): the one table the chat and Messages fault tests share."""

from __future__ import annotations

# fault -> (error code, receipt outcome, column of spec §12 for a streaming caller:
# "head" = an HTTP error before the first byte, "event" = one final error event).
# A fault in the worker's first event is a head failure (its first event is a violation).
CHAT_FAULTS: dict[str, tuple[str, str, str]] = {
    "missing_done": ("upstream_unavailable", "incomplete", "event"),
    "close_mid": ("upstream_unavailable", "incomplete", "event"),
    "error_json": ("upstream_error", "upstream_error", "event"),
    "error_raw": ("upstream_error", "upstream_error", "event"),
    "error_first": ("upstream_error", "upstream_error", "head"),
    "id_change": ("upstream_protocol_error", "protocol_error", "event"),
    "created_change": ("upstream_protocol_error", "protocol_error", "event"),
    "model_change": ("upstream_protocol_error", "protocol_error", "event"),
    "two_choices": ("upstream_protocol_error", "protocol_error", "head"),
    "role_change": ("upstream_protocol_error", "protocol_error", "event"),
    "usage_early": ("upstream_protocol_error", "protocol_error", "head"),
    "bad_usage": ("upstream_protocol_error", "protocol_error", "event"),
    "too_many_tokens": ("upstream_protocol_error", "protocol_error", "event"),
    "bad_finish": ("upstream_protocol_error", "protocol_error", "event"),
    "named_event": ("upstream_protocol_error", "protocol_error", "event"),
    "after_done": ("upstream_protocol_error", "protocol_error", "event"),
    "invalid_utf8": ("upstream_protocol_error", "protocol_error", "event"),
    "json_body": ("upstream_protocol_error", "protocol_error", "head"),
    "wrong_content_type": ("upstream_protocol_error", "protocol_error", "head"),
    "gzip": ("upstream_protocol_error", "protocol_error", "head"),
    "redirect": ("upstream_protocol_error", "protocol_error", "head"),
    "wrong_request_id": ("upstream_protocol_error", "protocol_error", "head"),
    "endless_line": ("upstream_protocol_error", "protocol_error", "head"),
    "huge_headers": ("upstream_protocol_error", "protocol_error", "head"),
    "hang": ("upstream_timeout", "incomplete", "head"),
    "hang_headers": ("upstream_timeout", "incomplete", "head"),
    "hang_mid": ("upstream_timeout", "incomplete", "event"),
}
STATUS = {
    "upstream_error": 502,
    "upstream_protocol_error": 502,
    "upstream_unavailable": 502,
    "upstream_timeout": 504,
}
