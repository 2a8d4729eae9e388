"""The mistral.rs protocol simulator speaks the reference's bytes, faults included."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.testing.simulator import DEFAULT_MODEL_ID, FAULTS, Simulator
from tests.testing.simulator.wire import Raw, exchange, http_request, parse, read_raw

MODEL = DEFAULT_MODEL_ID
CHAT = "/v1/chat/completions"
USAGE_KEYS = [
    "completion_tokens",
    "prompt_tokens",
    "total_tokens",
    "avg_tok_per_sec",
    "avg_prompt_tok_per_sec",
    "avg_compl_tok_per_sec",
    "total_time_sec",
    "total_prompt_time_sec",
    "total_completion_time_sec",
]
# Reference §3.2, verbatim; the test substitutes id, created, model, content, usage.
REF_CHUNK = (
    'data: {"id":"7","choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hel",'
    '"role":"assistant","tool_calls":null},"logprobs":null}],"created":1755870000,'
    '"model":"Qwen/Qwen3-4B","system_fingerprint":"local","object":"chat.completion.chunk",'
    '"usage":null}\n\n'
)
REF_FINAL = (
    'data: {"id":"7","choices":[{"finish_reason":"stop","index":0,"delta":{"content":"",'
    '"role":"assistant","tool_calls":null},"logprobs":null}],"created":1755870000,'
    '"model":"Qwen/Qwen3-4B","system_fingerprint":"local","object":"chat.completion.chunk",'
    '"usage":USAGE}\n\n'
)
ERROR_JSON = (
    b'data: {"error":{"message":"simulated engine error","type":"server_error",'
    b'"param":null,"code":null}}'
)


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    simulator = Simulator()
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def client(sim: Simulator) -> Iterator[httpx.Client]:
    sim.reset()
    with httpx.Client(base_url=sim.base_url, timeout=5) as c:
        yield c


# ------------------------------------------------------------------ helpers


def chat(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body = {"model": "default", "stream": stream, "messages": [{"role": "user", "content": text}]}
    return {**body, **extra}


def stream_raw(sim: Simulator, directive: str, timeout: float = 5.0, **extra: Any) -> Raw:
    return read_raw(sim.port, http_request(CHAT, chat(directive, **extra)), timeout)


# ------------------------------------------------------------- the happy path


def test_stream_bytes_match_the_reference_example(sim: Simulator) -> None:
    sim.reset()
    raw = stream_raw(sim, "hi [[sim chunks=1]]")
    assert raw.status == 200 and raw.terminated and raw.ending == "eof"
    assert raw.header("content-type") == "text/event-stream"
    assert raw.header("cache-control") == "no-cache"
    assert raw.header("x-simulator") == "mistralrs-protocol-simulator"
    assert raw.header("content-length") is None
    chunks = raw.chunks()
    cid, created = chunks[0]["id"], chunks[0]["created"]
    assert re.fullmatch(r"[0-9]+", cid)
    usage = chunks[-1]["usage"]
    assert list(usage) == USAGE_KEYS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] == 1

    def fill(template: str, content: str = "sim-token-0 ") -> bytes:
        text = template.replace('"id":"7"', f'"id":"{cid}"')
        text = text.replace("1755870000", str(created)).replace("Qwen/Qwen3-4B", MODEL)
        text = text.replace('"Hel"', json.dumps(content))
        return text.replace("USAGE", json.dumps(usage, separators=(",", ":"))).encode()

    # one event per chunk frame, as hyper writes them
    assert raw.frames == [fill(REF_CHUNK), fill(REF_FINAL), b"data: [DONE]\n\n"]


def test_non_stream_json_has_the_reference_shape(client: httpx.Client) -> None:
    response = client.post(CHAT, json=chat("[[sim chunks=3]]", stream=False))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == [
        "id",
        "choices",
        "created",
        "model",
        "system_fingerprint",
        "object",
        "usage",
    ]
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["choices"] == [
        {
            "finish_reason": "stop",
            "index": 0,
            "message": {
                "content": "sim-token-0 sim-token-1 sim-token-2 ",
                "role": "assistant",
                "tool_calls": None,
            },
            "logprobs": None,
        }
    ]
    assert list(body["usage"]) == USAGE_KEYS and body["usage"]["completion_tokens"] == 3
    text = client.post("/v1/completions", json={"prompt": "x [[sim chunks=2]]"}).json()
    assert text["object"] == "text_completion"
    assert text["choices"][0] == {
        "finish_reason": "stop",
        "index": 0,
        "text": "sim-token-0 sim-token-1 ",
        "logprobs": None,
    }


def test_completions_stream_has_no_usage_key(sim: Simulator) -> None:
    raw = read_raw(sim.port, http_request("/v1/completions", {"prompt": "p", "stream": True}))
    chunks = raw.chunks()
    assert len(chunks) == 9 and all("usage" not in c for c in chunks)
    assert list(chunks[0]) == [
        "id",
        "choices",
        "created",
        "model",
        "system_fingerprint",
        "object",
    ]
    assert chunks[0]["choices"] == [
        {"text": "sim-token-0 ", "index": 0, "logprobs": None, "finish_reason": None}
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert raw.events()[-1] == b"data: [DONE]"


def test_max_tokens_stops_with_length_on_the_last_text_chunk(sim: Simulator) -> None:
    chunks = stream_raw(sim, "[[sim chunks=8]]", max_tokens=3).chunks()
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == [
        "sim-token-0 ",
        "sim-token-1 ",
        "sim-token-2 ",
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert [c["usage"] is None for c in chunks] == [True, True, False]
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_tool_call_unicode_and_extras(sim: Simulator) -> None:
    final = stream_raw(sim, "[[sim chunks=0 tool_call=1]]").chunks()[-1]
    choice = final["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["delta"]["content"] is None
    (call,) = choice["delta"]["tool_calls"]
    assert list(call) == ["index", "id", "type", "function"]
    assert call["id"].startswith("call-") and call["type"] == "function"
    assert call["function"] == {"name": "lookup", "arguments": '{"q":1}'}
    raw = stream_raw(sim, "[[sim unicode=1 chunks=5 extras=1]]")
    text = "".join(c["choices"][0]["delta"]["content"] for c in raw.chunks())
    assert "héllo" in text and "日本" in text and "🙂" in text
    final = raw.chunks()[-1]
    assert final["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert final["choices"][0]["stop_sequence"] == "</sim>"


def test_directive_is_read_from_the_last_user_message_only(client: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": "[[sim chunks=1]]"},
        {"role": "assistant", "content": "[[sim chunks=4]]"},
        {"role": "user", "content": [{"type": "text", "text": "look [[sim chunks=2]]"}]},
    ]
    body = client.post(CHAT, json={"messages": messages}).json()
    assert body["usage"]["completion_tokens"] == 2
    bad = client.post(CHAT, json=chat("[[sim chunkz=2]]"))
    assert bad.status_code == 400 and bad.text.startswith("simulator:")


def test_constructor_defaults_and_directives_switch() -> None:
    simulator = Simulator(chunks=3, directives=False)
    simulator.start()
    try:
        with httpx.Client(base_url=simulator.base_url, timeout=5) as c:
            body = c.post(CHAT, json=chat("[[sim chunks=7]]", stream=False)).json()
        assert body["usage"]["completion_tokens"] == 3
    finally:
        simulator.stop()
    with pytest.raises(ValueError, match="loopback"):
        Simulator(host="0.0.0.0")
    with pytest.raises(ValueError):
        Simulator(fault="nonsense")


def test_the_text_knob_replaces_the_filler_cut_into_chunks() -> None:
    """For a caller that needs a given answer (JSON for a schema): the same text
    streamed and not, chat and Responses; set_knobs only, not a directive."""
    answer = '{"city": "Paris", "country": "France"}'
    simulator = Simulator(chunks=4, text=answer)
    simulator.start()
    try:
        with httpx.Client(base_url=simulator.base_url, timeout=5) as c:
            plain = c.post(CHAT, json=chat("hi", stream=False)).json()
            streamed = c.post(CHAT, json=chat("hi", stream=True)).text
            responses = c.post("/v1/responses", json={"input": "hi", "stream": True}).text
            simulator.set_knobs(text=None)
            filler = c.post(CHAT, json=chat("hi", stream=False)).json()
    finally:
        simulator.stop()
    assert plain["choices"][0]["message"]["content"] == answer
    assert plain["usage"]["completion_tokens"] == 4
    pieces = [
        json.loads(line[6:])["choices"][0]["delta"]["content"]
        for line in streamed.splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(pieces) == answer and len(pieces) == 5  # 4 pieces, then the final ""
    deltas = [
        json.loads(line[6:])["delta"]
        for line in responses.splitlines()
        if line.startswith('data: {"type":"response.output_text.delta"')
    ]
    assert "".join(deltas) == answer
    assert filler["choices"][0]["message"]["content"].startswith("sim-token-0 ")


# ---------------------------------------------------------- HTTP behaviour


def test_keepalive_comments_fill_idle_time(sim: Simulator) -> None:
    raw = stream_raw(sim, "[[sim chunks=1 keepalive_ms=20 first_delay_ms=90]]")
    events = raw.events()
    first_data = next(i for i, e in enumerate(events) if e.startswith(b"data:"))
    assert first_data >= 2 and set(events[:first_data]) == {b":"}
    assert b":\n\n" in raw.frames  # a comment is its own chunk frame


def test_request_id_echo_and_generation(sim: Simulator, client: httpx.Client) -> None:
    assert (
        client.get("/health", headers={"x-request-id": "abc-123"}).headers["x-request-id"]
        == "abc-123"
    )
    generated = client.get("/nowhere").headers["x-request-id"]
    assert re.fullmatch(r"req_[0-9a-f]{32}", generated)
    raw = read_raw(
        sim.port, b"GET /health HTTP/1.1\r\nx-request-id: \xff\xfe\r\nconnection: close\r\n\r\n"
    )
    assert re.fullmatch(r"req_[0-9a-f]{32}", raw.header("x-request-id") or "")


def test_routes_statuses_and_errors(client: httpx.Client) -> None:
    health = client.get("/health")
    assert (health.status_code, health.text) == (200, "OK")
    missing = client.get("/v1/nothing")
    assert (missing.status_code, missing.content) == (404, b"")
    assert client.get(CHAT).status_code == 405
    not_json = client.post(CHAT, content=b"{oops", headers={"content-type": "application/json"})
    assert not_json.status_code == 400
    assert not_json.headers["content-type"].startswith("text/plain")
    assert not_json.text.startswith("Failed to deserialize the JSON body")
    assert (
        client.post(CHAT, content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
    )
    assert client.post(CHAT, json={"model": "default"}).status_code == 422
    unknown = client.post(CHAT, json={"model": "other", "messages": "hi"})
    assert unknown.status_code == 500
    assert unknown.json() == {
        "message": f"Requested model 'other' is not available. Available models: {MODEL}. "
        "Use 'default' to use the default model."
    }
    failed = client.post(CHAT, json=chat("[[sim status=503]]"))
    assert (failed.status_code, failed.json()) == (503, {"message": "simulated failure"})


def test_admin_routes_answer_200_and_change_the_model_status(
    sim: Simulator, client: httpx.Client
) -> None:
    unload = client.post("/v1/models/unload", json={"model_id": MODEL})
    assert unload.json() == {"model_id": MODEL, "status": "unloaded"}
    status = client.post("/v1/models/status", json={"model_id": "nope"}).json()
    assert status == {"model_id": "nope", "status": "not_found"}
    isq = client.post("/re_isq", json={"ggml_type": "Q4K"})
    assert isq.status_code == 200 and isq.headers["content-type"].startswith("text/plain")
    # a request for an unloaded model reloads it, as the engine does
    assert client.post(CHAT, json=chat("[[sim chunks=1]]", stream=False)).status_code == 200
    assert client.get("/v1/models").json()["data"][1]["status"] == "loaded"
    paths = [r.path for r in sim.requests()]
    assert paths[:3] == ["/v1/models/unload", "/v1/models/status", "/re_isq"]


def test_models_list_and_its_knobs(sim: Simulator, client: httpx.Client) -> None:
    body = client.get("/v1/models").json()
    created = body["data"][0]["created"]
    assert body == {
        "object": "list",
        "data": [
            {
                "id": "default",
                "object": "model",
                "created": created,
                "owned_by": "local",
                "root": "default",
            },
            {
                "id": MODEL,
                "object": "model",
                "created": created,
                "owned_by": "local",
                "root": MODEL,
                "status": "loaded",
            },
        ],
    }
    sim.set_model_status("reloading")
    assert client.get("/v1/models").json()["data"][1]["status"] == "reloading"
    sim.set_model_entries(2)
    assert [d["id"] for d in client.get("/v1/models").json()["data"]] == ["default", MODEL, MODEL]
    sim.set_model_status(None)
    assert [d["id"] for d in client.get("/v1/models").json()["data"]] == ["default"]
    sim.set_models_fault("bad_body")
    with pytest.raises(json.JSONDecodeError):
        client.get("/v1/models").json()
    sim.set_models_fault("hang")
    with pytest.raises(httpx.ReadTimeout):
        client.get("/v1/models", timeout=0.3)


def test_keep_alive_pipelining_and_chunked_request_bodies(sim: Simulator) -> None:
    sim.reset()
    body = json.dumps(chat("[[sim chunks=1]]", stream=False)).encode()
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        + b"%x\r\n%b\r\n" % (10, body[:10])
        + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body) - 10, body[10:])
    )
    raw = exchange(sim.port, http_request("/health", method="GET", close=False) + chunked, 2)
    assert raw.count(b"HTTP/1.1 200 OK") == 2
    first, second = sim.requests()
    assert first.path == "/health" and second.body == body and second.json is not None
    assert second.headers["transfer-encoding"] == "chunked"


def test_split_writes_give_identical_bytes(sim: Simulator) -> None:
    def normalised(raw: Raw) -> bytes:
        return re.sub(rb'"id":"[0-9]+"', b'"id":"N"', raw.body)

    whole = stream_raw(sim, "[[sim chunks=3 unicode=1 split=0]]")  # same prompt length
    split = stream_raw(sim, "[[sim chunks=3 unicode=1 split=1]]")
    assert split.terminated and split.frames[-1] == b"data: [DONE]\n\n"
    assert normalised(split) == normalised(whole)


def test_pad_makes_large_streams_and_bytes_sent_counts_them(sim: Simulator) -> None:
    sim.reset()
    raw = stream_raw(sim, "[[sim chunks=40 pad=4096]]")
    assert raw.terminated and raw.frames[-1] == b"data: [DONE]\n\n"
    texts = [c["choices"][0]["delta"]["content"] for c in raw.chunks()]
    assert [len(t) for t in texts[:40]] == [4096] * 40
    assert texts[0].startswith("sim-token-0 ") and texts[0].endswith("...")
    # Every response byte written (head and chunked framing included) is counted.
    (request,) = sim.requests()
    assert request.bytes_sent >= len(raw.body) > 40 * 4096


def test_disconnect_is_recorded_at_once_and_frees_the_stream(sim: Simulator) -> None:
    sim.reset()
    request = http_request(CHAT, chat("[[sim chunks=200 delay_ms=20]]"))
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        assert sim.active_streams == 1
        closed_at = time.monotonic()
    assert sim.wait_for(lambda: sim.requests()[0].disconnected_at is not None, 2)
    (record,) = sim.requests()
    assert record.disconnected_at is not None
    print(
        f"simulator saw the disconnect {1000 * (record.disconnected_at - closed_at):.1f} ms after"
    )
    assert sim.wait_for(lambda: sim.active_streams == 0, 2)
    assert sim.requests()[0].completed is False


def test_non_stream_generation_outlives_its_client(sim: Simulator) -> None:
    sim.reset()
    request = http_request(CHAT, chat("[[sim chunks=6 delay_ms=60]]", stream=False))
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(request)
        assert sim.wait_for(lambda: sim.active_streams == 1, 2)
    assert sim.wait_for(lambda: sim.requests()[0].disconnected_at is not None, 2)
    assert sim.active_streams == 1  # the engine keeps generating a non-streamed request
    assert sim.wait_for(lambda: sim.active_streams == 0, 3)
    (record,) = sim.requests()
    assert record.finished_at is not None and record.disconnected_at is not None
    assert record.finished_at > record.disconnected_at and not record.completed


async def test_max_active_streams_counts_concurrent_inference(sim: Simulator) -> None:
    sim.reset()
    async with httpx.AsyncClient(base_url=sim.base_url, timeout=5) as c:

        async def one() -> int:
            body = chat("[[sim chunks=4 delay_ms=40]]")
            async with c.stream("POST", CHAT, json=body) as response:
                return len([line async for line in response.aiter_lines() if line])

        counts = await asyncio.gather(one(), one(), one())
    assert list(counts) == [6, 6, 6]
    assert sim.max_active_streams == 3 and sim.active_streams == 0
    assert all(r.completed and r.finished_at is not None for r in sim.requests())


# ------------------------------------------------------------------- faults


def _choices(raw: Raw) -> list[dict[str, Any]]:
    return [c["choices"][0] for c in raw.chunks()]


def _content_events(raw: Raw) -> int:
    return sum(1 for choice in _choices(raw) if choice["delta"]["content"])


def _usage_adds_up(raw: Raw) -> bool:
    usage = raw.chunks()[-1]["usage"]
    return bool(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"])


def _distinct(raw: Raw, key: str) -> int:
    return len({c[key] for c in raw.chunks()})


def _early_usage(raw: Raw) -> bool:
    first = raw.chunks()[0]
    return first["usage"] is not None and first["choices"][0]["finish_reason"] is None


def _gzip_sse(raw: Raw) -> bool:
    encoded = raw.header("content-encoding") == "gzip"
    return encoded and gzip.decompress(raw.body).endswith(b"data: [DONE]\n\n")


def _ends_with_done(raw: Raw) -> bool:
    return raw.events()[-1] == b"data: [DONE]"


FAULT_CHECKS: dict[str, Callable[[Raw], bool]] = {
    "missing_done": lambda r: r.terminated and b"[DONE]" not in r.body and _usage_adds_up(r),
    "close_mid": lambda r: not r.terminated and _content_events(r) == 2,
    "error_json": lambda r: r.terminated and r.events()[2:] == [ERROR_JSON, b"data: [DONE]"],
    "error_raw": lambda r: r.events()[2:] == [b"data: simulated engine error", b"data: [DONE]"],
    "error_first": lambda r: r.events() == [ERROR_JSON, b"data: [DONE]"],
    "id_change": lambda r: _distinct(r, "id") == 2,
    "created_change": lambda r: _distinct(r, "created") == 2,
    "model_change": lambda r: _distinct(r, "model") == 2,
    "two_choices": lambda r: all(len(c["choices"]) == 2 for c in r.chunks()),
    "role_change": lambda r: any(c["delta"]["role"] == "user" for c in _choices(r)),
    "nul_text": lambda r: any("\x00" in (c["delta"]["content"] or "") for c in _choices(r)),
    "usage_early": _early_usage,
    "bad_usage": lambda r: not _usage_adds_up(r),
    "too_many_tokens": lambda r: r.chunks()[-1]["usage"]["completion_tokens"] == 11,
    "bad_finish": lambda r: _choices(r)[-1]["finish_reason"] == "content_filter",
    "named_event": lambda r: any(e.startswith(b"event: ") for e in r.events()),
    "after_done": lambda r: r.events()[-2] == b"data: [DONE]" and b'"id"' in r.events()[-1],
    "hang": lambda r: r.status == 200 and r.body == b"" and r.ending == "timeout",
    "hang_headers": lambda r: r.head_bytes == 0 and r.ending == "timeout",
    "hang_mid": lambda r: _content_events(r) == 2 and r.ending == "timeout" and not r.terminated,
    "json_body": lambda r: (
        r.header("content-type") == "application/json"
        and json.loads(r.body)["object"] == "chat.completion"
    ),
    "wrong_content_type": lambda r: (
        r.header("content-type") == "text/plain; charset=utf-8" and _ends_with_done(r)
    ),
    "huge_headers": lambda r: r.head_bytes > 200 * 1024 and r.terminated and _ends_with_done(r),
    "endless_line": lambda r: r.body.startswith(b"data: xxx") and b"\n" not in r.body,
    "gzip": _gzip_sse,
    "redirect": lambda r: r.status == 307 and r.header("location") == "/sim/redirected",
    "wrong_request_id": lambda r: r.header("x-request-id") not in (None, "mine-1"),
    "no_request_id": lambda r: r.header("x-request-id") is None,
    "invalid_utf8": lambda r: b"\xff\xfe" in r.body,
}

_SLOW = {"hang", "hang_headers", "hang_mid"}


def test_every_fault_has_a_check() -> None:
    assert set(FAULT_CHECKS) == FAULTS


@pytest.mark.parametrize("fault", sorted(FAULT_CHECKS))
def test_fault_produces_its_bytes(sim: Simulator, fault: str) -> None:
    sim.reset()
    body = chat(f"[[sim chunks=4 fault={fault}]]", max_tokens=10)
    request = http_request(CHAT, body, headers={"x-request-id": "mine-1"})
    timeout = 0.3 if fault in _SLOW else 5.0
    if fault == "endless_line":
        raw = parse(exchange(sim.port, request, timeout, limit=1 << 20))
    else:
        raw = read_raw(sim.port, request, timeout)
    assert FAULT_CHECKS[fault](raw), raw
    if fault == "endless_line":
        assert sim.wait_for(lambda: sim.active_streams == 0, 2)  # stops when the client goes


def _stop_under_load(request: bytes) -> bool:
    """Start, load with streaming requests from six threads, stop; True if the loop ended."""
    sim = Simulator()
    sim.start()
    stop = threading.Event()
    held: list[socket.socket] = []

    def hammer() -> None:
        deadline = time.monotonic() + 5
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                sock = socket.create_connection(("127.0.0.1", sim.port), timeout=1)
            except OSError:
                continue
            held.append(sock)  # closed by the test, whether or not the send got through
            with contextlib.suppress(OSError):
                sock.sendall(request)

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(6)]
    for thread in threads:
        thread.start()
    assert sim.wait_for(lambda: sim.active_streams >= 20, 5)
    sim.stop()
    stop.set()
    for thread in threads:
        thread.join(5)
    for sock in held:
        sock.close()
    return sim._thread is not None and not sim._thread.is_alive()


def test_stop_under_load_leaves_nothing_running(caplog: pytest.LogCaptureFixture) -> None:
    """Connections accepted just before the stop are shut down too (no orphaned task)."""
    request = http_request(CHAT, chat("[[sim chunks=50 delay_ms=20]]"))
    assert all(_stop_under_load(request) for _ in range(3))
    gc.collect()
    assert "Task was destroyed" not in caplog.text
