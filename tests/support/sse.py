"""Build worker SSE the way mistral.rs writes it (key order, nulls, compact JSON).

Shared by the validator's tests and its micro-benchmark (bench/bench_sse.py).
"""

from __future__ import annotations

import json
from typing import Any

MODEL = "Qwen/Qwen3-4B"


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
