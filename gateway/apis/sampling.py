"""Fields chat and text completions share: OpenAI sampling and mistral.rs's
extensions (reference §6), each with its type, plus what neither forwards.
Responses takes the extensions (:data:`ENGINE_SAMPLING`) and the harmless
names too, with its own OpenAI sampling fields.

Refused names (spec §12) are the agentic and server-side-tool fields, named
so the refusal says why; harmless names (spec §14) change nothing for the
worker and are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.apis.fields import (
    Spec,
    any_json,
    boolean,
    enum,
    harmless,
    integer,
    json_size,
    list_of,
    map_of,
    number,
    obj,
    string,
    string_or_strings,
    text_size,
    token_id,
)
from gateway.core.errors import GatewayError

REFUSED_FIELDS: Mapping[str, str] = {
    name: "is not supported (agentic and server-side tool features are not served)"
    for name in (
        "web_search_options",
        "max_tool_rounds",
        "enable_shell",
        "agent_permission",
        "code_execution_permission",
        "session_id",
        "files",
        "adapter",
    )
}

#: accepted and not forwarded (spec §14); ``store`` only on chat completions
HARMLESS_FIELDS: Mapping[str, Spec] = {
    name: harmless for name in ("metadata", "service_tier", "safety_identifier", "prompt_cache_key")
}

GRAMMAR = obj(
    {"type": enum("regex", "json_schema", "lark", "llguidance"), "value": any_json},
    required=("type", "value"),
)

STREAM_OPTIONS = obj({"include_usage": boolean, "include_obfuscation": harmless})

#: mistral.rs's sampling extensions (reference §6), the same on every generating endpoint
ENGINE_SAMPLING: Mapping[str, Spec] = {
    "top_k": integer(ge=0),
    "min_p": number(ge=0, le=1),
    "repetition_penalty": number(),
    "dry_multiplier": number(),
    "dry_base": number(),
    "dry_allowed_length": integer(ge=0),
    "dry_sequence_breakers": list_of(string, max_items=256),
    "grammar": GRAMMAR,
}

SAMPLING: Mapping[str, Spec] = {
    "model": string,
    "stream": boolean,
    "stream_options": STREAM_OPTIONS,
    "max_tokens": integer(),
    "temperature": number(ge=0),
    "top_p": number(ge=0, le=1),
    "n": integer(),
    "stop": string_or_strings(max_items=64),
    "presence_penalty": number(),
    "frequency_penalty": number(),
    "logit_bias": map_of(token_id, number()),
    "seed": integer(),
    "user": string,
    **ENGINE_SAMPLING,
    "truncate_sequence": boolean,
    **HARMLESS_FIELDS,
}

#: fields whose text the worker tokenizes or compiles besides the prompt itself
_COMPILED = ("stop", "grammar", "logit_bias", "dry_sequence_breakers")


def compiled_bytes(body: Mapping[str, Any]) -> int:
    """Bytes of what the worker reads beyond messages/prompt (spec §13)."""
    total = 0
    for name in _COMPILED:
        value = body.get(name)
        if value is None:
            continue
        total += text_size(value) if isinstance(value, str) else json_size(value)
    return total


def check_single_choice(body: Mapping[str, Any]) -> None:
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise GatewayError("invalid_request", "Only one choice is supported.", param=name)
