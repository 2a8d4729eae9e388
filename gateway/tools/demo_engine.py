"""``mistralrs-gateway demo --engine``: the demo with real inference, text only.

Starts the adapter around the real mistral.rs engine (test equipment:
``gateway/testing/engine``, PyPI ``mistralrs`` on a locally generated
RANDOM-WEIGHT Llama, so the text means nothing) as a child process, the
gateway in front of it on loopback with a generated config, sends one
authenticated streaming chat request and one non-streaming request, and
prints one JSON report: the engine's own usage and timing, what the caller
measured (TTFT, tokens/s), and both receipts. The adapter is stopped by its
PID in a ``finally``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.auth.authenticator import mint_dev_token
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    Gateway,
    default_policy,
    new_dev_secret,
    wait_receipt,
    write_config,
)
from gateway.tools.demo import read_stream

ALIAS = "random-llama"
NOTE = (
    "random-weight model, real mistral.rs engine through an adapter; text is meaningless "
    "(test equipment: gateway/testing/engine, not `mistralrs serve`)"
)
PROMPT = "Tell me a story about the sea."


def run_engine_demo(size: str = "small", max_tokens: int = 128) -> int:
    try:
        from gateway.testing.engine.process import start_adapter
    except ImportError as exc:  # the engine extra is not installed
        print(f"demo --engine needs the engine extra (make setup): {exc}", file=sys.stderr)
        return 1
    secret = new_dev_secret()
    os.environ[DEMO_SECRET_ENV] = secret
    adapter = start_adapter(size)
    try:
        with tempfile.TemporaryDirectory(prefix="mistralrs-gateway-demo-engine-") as tmp:
            # The demo tenant has the worker to itself: it may see the engine's
            # timings and cache figures (spec §21 usage_details).
            policy = default_policy(
                "demo", models={ALIAS: adapter.route}, modalities=["text"], usage_details="full"
            )
            config = write_config(
                Path(tmp),
                upstream_port=adapter.port,
                policies={"demo": policy},
                upstream={"route": adapter.route, "readiness_timeout_s": 10},
            )
            with Gateway(config) as gateway:
                if not gateway.wait_ready(30):
                    print("demo: the gateway never saw the engine adapter ready", file=sys.stderr)
                    return 1
                report = _exchange(gateway, secret, max_tokens)
                report["adapter"] = {
                    "model_size": size,
                    "model": adapter.route,
                    "pid": adapter.pid,
                    "stats": adapter.stats(),
                }
    finally:
        adapter.stop()
    print(json.dumps({"note": NOTE, **report}, indent=2, ensure_ascii=False))
    ok = report["stream"]["done"] and report["stream_receipt"]["outcome"] in ("complete", "length")
    return 0 if ok and report["non_stream_receipt"]["outcome"] in ("complete", "length") else 1


def _body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def _stream(client: httpx.Client, max_tokens: int) -> dict[str, Any]:
    body = _body(max_tokens, stream=True, stream_options={"include_usage": True})
    read = read_stream(client, body)
    chunks, first_content = read.chunks, read.first_content
    usage = chunks[-1].get("usage") if chunks else None
    tokens = usage["completion_tokens"] if usage else None
    decode_s = read.ended - first_content if first_content is not None else None
    return {
        "status": read.status,
        "request_id": read.request_id,
        "chunks": len(chunks),
        "keepalives": read.keepalives,
        "done": read.done,
        "finish_reason": chunks[-1]["choices"][0]["finish_reason"] if chunks else None,
        "engine_usage": usage,
        "caller_measured": {
            "ttft_ms": round((first_content - read.sent) * 1000, 1) if first_content else None,
            "stream_s": round(read.ended - read.sent, 3),
            "tokens_per_s_after_first": round((tokens - 1) / decode_s, 1)
            if tokens and decode_s
            else None,
        },
        "text_sample (meaningless)": read.text[:80],
    }


def _exchange(gateway: Gateway, secret: str, max_tokens: int) -> dict[str, Any]:
    runtime = gateway.runtime
    token = mint_dev_token(
        runtime.config.auth, "demo", scopes=["inference"], ttl_s=300, env={DEMO_SECRET_ENV: secret}
    )
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=120) as client:
        stream = _stream(client, max_tokens)
        sent = time.monotonic()
        response = client.post("/v1/chat/completions", json=_body(max_tokens // 2))
        elapsed = time.monotonic() - sent
    answer = response.json()
    choice = (answer.get("choices") or [{}])[0]
    non_stream = {
        "status": response.status_code,
        "request_id": response.headers.get("x-request-id"),
        "x-usage-source": response.headers.get("x-usage-source"),
        "finish_reason": choice.get("finish_reason"),
        "engine_usage": answer.get("usage"),
        "caller_measured": {"answer_s": round(elapsed, 3)},
        "content_sample (meaningless)": ((choice.get("message") or {}).get("content") or "")[:80],
    }
    audit = runtime.config.audit.path
    return {
        "stream": stream,
        "stream_receipt": wait_receipt(audit, stream["request_id"] or "", 10),
        "non_stream": non_stream,
        "non_stream_receipt": wait_receipt(audit, non_stream["request_id"] or "", 10),
    }
