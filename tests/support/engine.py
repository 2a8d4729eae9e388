"""The engine lane for tests: the adapter around the real mistral.rs engine as a subprocess.

The process side (``start_adapter()``, ``running_adapter()``, the adapter's
counters, a process's CPU seconds) lives in ``gateway/testing/engine/process.py``
and is re-exported here; this module adds a strict parser of the SSE bytes the
adapter writes and a request body. The model's text is random-weight output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.testing.engine.process import (
    EngineAdapter,
    cpu_rate,
    cpu_seconds,
    running_adapter,
    start_adapter,
)

__all__ = [
    "EngineAdapter",
    "Named",
    "Stream",
    "agentic_stream",
    "chat_body",
    "cpu_rate",
    "cpu_seconds",
    "parse_sse",
    "running_adapter",
    "start_adapter",
]


@dataclass(frozen=True)
class Named:
    """A named event (``event: <name>`` then ``data: <json>``): the agentic events."""

    name: str
    data: dict[str, Any]
    raw: bytes  # the data line's JSON text, as written


@dataclass
class Stream:
    """A parsed SSE body: the data events (JSON, ``"[DONE]"`` or :class:`Named`),
    keep-alives, raw bytes."""

    events: list[Any]
    keepalives: int
    raw: bytes

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict)]

    @property
    def named(self) -> list[Named]:
        return [e for e in self.events if isinstance(e, Named)]

    def text(self) -> str:
        return "".join(c["choices"][0]["delta"]["content"] or "" for c in self.chunks)


def parse_sse(raw: bytes) -> Stream:
    """Strict: every event is ``:``, ``data: <one line>`` or ``event: <name>`` +
    ``data: <one line>``, each ended by exactly ``\\n\\n``."""
    if not raw.endswith(b"\n\n"):
        raise ValueError("the body does not end with a complete event")
    events: list[Any] = []
    keepalives = 0
    for frame in raw[:-2].split(b"\n\n"):
        if frame == b":":
            keepalives += 1
        elif frame.startswith(b"data: ") and b"\n" not in frame:
            payload = frame[len(b"data: ") :]
            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
        elif frame.startswith(b"event: ") and frame.count(b"\n") == 1:
            name, data = frame.split(b"\n")
            if not data.startswith(b"data: "):
                raise ValueError(f"a named event without its data: {frame[:80]!r}")
            payload = data[len(b"data: ") :]
            events.append(Named(name[len(b"event: ") :].decode(), json.loads(payload), payload))
        else:
            raise ValueError(f"not an event the server writes: {frame[:80]!r}")
    return Stream(events, keepalives, raw)


def chat_body(**fields: Any) -> dict[str, Any]:
    """A greedy chat request body; ``fields`` override or add."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    body.update(fields)
    return body


Decide = Callable[[dict[str, Any]], dict[str, Any] | None]


def agentic_stream(base_url: str, body: dict[str, Any], decide: Decide) -> tuple[Stream, list[Any]]:
    """POST a streaming chat request straight to the adapter and read it event by
    event; at each ``agentic_tool_approval_required`` post ``decide(event data)``
    (None: post nothing) to ``/v1/agent/approvals/{id}``. The parsed stream, and
    the approval route's answers ``(status, json)`` in order."""
    posted: list[Any] = []
    raw = b""
    with (
        httpx.Client(base_url=base_url, timeout=60) as client,
        client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200, response.read()
        pending = b""
        for part in response.iter_raw():
            raw += part
            pending += part
            while b"\n\n" in pending:
                frame, pending = pending.split(b"\n\n", 1)
                if not frame.startswith(b"event: agentic_tool_approval_required\n"):
                    continue
                data = json.loads(frame.split(b"\ndata: ", 1)[1])
                decision = decide(data)
                if decision is not None:
                    route = f"/v1/agent/approvals/{data['approval_id']}"
                    answer = client.post(route, json=decision)
                    posted.append((answer.status_code, answer.json()))
    return parse_sse(raw), posted
