"""Build worker SSE the way mistral.rs writes it (key order, nulls, compact JSON).

Shared by the validator's tests and its micro-benchmark (bench/bench_sse.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, StreamValidator

MODEL = "Qwen/Qwen3-4B"


def drain(
    validator: StreamValidator[Any], pieces: Iterable[bytes]
) -> tuple[list[Any], GatewayError | None]:
    """Feed the pieces then EOF, draining events after every feed: the events
    (up to :class:`Done`) and the error that ended them, if one did."""
    events: list[Any] = []
    try:
        for piece in [*pieces, b""]:
            validator.receive_data(piece)
            while (event := validator.next_event()) is not NEED_DATA:
                events.append(event)
                if isinstance(event, Done):
                    return events, None
    except GatewayError as exc:
        return events, exc
    raise AssertionError("the validator still wanted data after EOF")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def chunk(content: Any = "x", finish: Any = None, usage: Any = None, **top: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "id": "7",
        "choices": [
            {
                "finish_reason": finish,
                "index": 0,
                "delta": {"content": content, "role": "assistant", "tool_calls": None},
                "logprobs": None,
            }
        ],
        "created": 1755870000,
        "model": MODEL,
        "system_fingerprint": "local",
        "object": "chat.completion.chunk",
        "usage": usage,
    }
    obj.update(top)
    return obj


def usage(completion: int = 2, prompt: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": completion + prompt,
        **extra,
    }


def event(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else dumps(obj)) + b"\n\n"


# -- the Responses named-event dialect (findings: mistral.rs responses.rs) -----

RESPONSE_ID = "resp_3b1f0c7a-9d2e-4a51-8f6b-1c2d3e4f5a6b"


def response_object(status: str = "in_progress", **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "id": RESPONSE_ID,
        "object": "response",
        "created_at": 1755870000,
        "model": MODEL,
        "status": status,
        "output": [],
    }
    obj.update(extra)
    return obj


def named(name: str, obj: Any) -> bytes:
    data = obj if isinstance(obj, bytes) else dumps(obj)
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def response_stream(
    deltas: list[str],
    *,
    terminal: str = "response.completed",
    usage: dict[str, Any] | None = None,
    done: bool = True,
) -> list[tuple[str, dict[str, Any]]]:
    """The worker's events for one text answer, in its order, sequence-numbered."""
    text = "".join(deltas)
    message = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": response_object("queued")}),
        ("response.in_progress", {"response": response_object()}),
        (
            "response.output_item.added",
            {"output_index": 0, "item": {**message, "status": "in_progress"}},
        ),
        (
            "response.content_part.added",
            {"output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": ""}},
        ),
        *(
            ("response.output_text.delta", {"output_index": 0, "content_index": 0, "delta": d})
            for d in deltas
        ),
        (
            "response.content_part.done",
            {"output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": text}},
        ),
    ]
    done_item = {
        **message,
        "status": "completed",
        "content": [{"type": "output_text", "text": text}],
    }
    events.append(("response.output_item.done", {"output_index": 0, "item": done_item}))
    final = response_object(
        {"response.completed": "completed", "response.incomplete": "incomplete"}.get(
            terminal, "failed"
        ),
        completed_at=1755870001,
        output=[done_item],
        output_text=text,
        usage=usage
        if usage is not None
        else {"input_tokens": 9, "output_tokens": len(deltas), "total_tokens": 9 + len(deltas)},
    )
    if terminal == "response.incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
    if terminal == "response.failed":
        final["error"] = {"type": "model_error", "message": "simulated"}
    events.append((terminal, {"response": final}))
    return [
        (name, {"type": name, "sequence_number": n, **body})
        for n, (name, body) in enumerate(events)
    ]


def response_bytes(events: list[tuple[str, dict[str, Any]]], *, done: bool = True) -> bytes:
    out = b"".join(named(name, obj) for name, obj in events)
    return out + (b"data: [DONE]\n\n" if done else b"")
