"""Helpers of the agentic tests: request bodies and a compact view of an event stream."""

from __future__ import annotations

from typing import Any

from tests.testing.simulator.wire import Event

CHAT = "/v1/chat/completions"
PROGRESS = "agentic_tool_call_progress"
APPROVAL = "agentic_tool_approval_required"
CODE_TOOL = {"type": "code_interpreter", "container": {"type": "auto"}}
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def agentic(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "default",
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
        "web_search_options": {},
        "tools": [CODE_TOOL],
    }
    return {**body, **extra}


def shape(events: list[Event]) -> list[str]:
    """One word an event: content, done, finish, or <event>:<phase|round>."""
    words: list[str] = []
    for e in events:
        if e.name is None:
            if e.data == b"[DONE]":
                words.append("done")
            else:
                words.append("finish" if e.json()["choices"][0]["finish_reason"] else "content")
        elif e.name == PROGRESS:
            words.append(f"{e.json()['phase']}:{e.json()['round']}")
        else:
            words.append(
                f"{e.name}:{e.json().get('round', e.json().get('source', {}).get('round'))}"
            )
    return words


def named(events: list[Event], name: str) -> list[dict[str, Any]]:
    return [e.json() for e in events if e.name == name]
