"""The adapter's wire format against the reference (§2, §3, §4, §5, §7), on the real engine.

The session's tiny-model adapter keeps streams alive every 1 ms, so keep-alive
comments sit between chunks and every stream below is parsed with them.
"""

from __future__ import annotations

import concurrent.futures
import re
from typing import Any

import httpx
import pytest

from gateway.testing.engine import modelgen
from tests.support import rawhttp
from tests.support.engine import EngineAdapter, Stream, chat_body, parse_sse


def _stream(
    tiny: EngineAdapter, body: dict[str, Any], **headers: str
) -> tuple[httpx.Response, Stream]:
    with httpx.stream(
        "POST",
        tiny.base_url + "/v1/chat/completions",
        json={**body, "stream": True},
        headers=headers,
        timeout=60,
    ) as response:
        raw = b"".join(response.iter_raw())
    return response, parse_sse(raw)


def _post(tiny: EngineAdapter, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(tiny.base_url + path, json=body, timeout=60, **kwargs)


def test_models_lists_default_then_the_loaded_model(tiny: EngineAdapter) -> None:
    answer = httpx.get(tiny.base_url + "/v1/models", timeout=10)
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "list"
    default, model = body["data"]
    created = default["created"]
    assert default == {
        "id": "default", "object": "model", "created": created, "owned_by": "local",
        "root": "default",
    }  # fmt: skip
    assert model == {
        "id": tiny.route, "object": "model", "created": created, "owned_by": "local",
        "root": tiny.route, "status": "loaded",
    }  # fmt: skip
    assert list(model) == ["id", "object", "created", "owned_by", "root", "status"]
    assert isinstance(created, int)


def test_a_greedy_stream_is_framed_as_the_server_frames_it(tiny: EngineAdapter) -> None:
    response, stream = _stream(tiny, chat_body(max_tokens=24))
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    assert stream.events[-1] == "[DONE]"
    assert stream.raw.endswith(b"data: [DONE]\n\n")  # and then the body's end
    chunks = stream.chunks
    assert len(chunks) == len(stream.events) - 1
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().isdecimal()
    for chunk in chunks:
        assert list(chunk)[:7] == [
            "id", "choices", "created", "model", "system_fingerprint", "object", "usage",
        ]  # fmt: skip
        assert chunk["model"] == tiny.route
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["system_fingerprint"] == "local"
        assert chunk["choices"][0]["delta"]["role"] == "assistant"
        assert chunk["choices"][0]["delta"]["tool_calls"] is None
    assert [c["usage"] is None for c in chunks[:-1]] == [True] * (len(chunks) - 1)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    usage = last["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"]


def test_keep_alives_are_bare_comments_between_whole_events(tiny: EngineAdapter) -> None:
    # A ~150-token prompt: its prefill alone outlasts the 1 ms keep-alive, so
    # the stream has comments by construction. A short prompt's 64 tokens can
    # all come less than 1 ms apart on the tiny model (it failed 2 runs in 7).
    prompt = "Say something. " * 30
    body = chat_body(max_tokens=64, messages=[{"role": "user", "content": prompt}])
    _, stream = _stream(tiny, body)  # parse_sse: strict framing
    assert stream.keepalives > 0
    assert stream.raw.startswith(b":\n\n")  # before the first token, during prefill
    assert stream.chunks[-1]["choices"][0]["finish_reason"] == "length"  # not an error event
    # Between chunks too: asserted on the small model (test_lane_small), whose
    # tokens take ~10 ms against the 1 ms keep-alive.
    assert stream.events[-1] == "[DONE]"


def test_the_callers_request_id_is_echoed_else_one_is_made(tiny: EngineAdapter) -> None:
    response, _ = _stream(tiny, chat_body(max_tokens=2), **{"x-request-id": "trace 42/a:b"})
    assert response.headers["x-request-id"] == "trace 42/a:b"
    made = httpx.get(tiny.base_url + "/v1/models", timeout=10).headers["x-request-id"]
    assert re.fullmatch(r"req_[0-9a-f]{32}", made)
    sock = rawhttp.connect(tiny.port)
    try:
        sock.sendall(rawhttp.request("GET", "/v1/models", headers=[("x-request-id", "caf\xe9")]))
        answer = rawhttp.read_response(sock, close_wait_s=0)
    finally:
        sock.close()
    assert re.fullmatch(r"req_[0-9a-f]{32}", answer.header("x-request-id") or "")


def test_the_non_streaming_answer_has_the_reference_shape(tiny: EngineAdapter) -> None:
    answer = _post(tiny, "/v1/chat/completions", chat_body(max_tokens=8))
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert list(body) == [
        "id", "choices", "created", "model", "system_fingerprint", "object", "usage",
    ]  # fmt: skip
    assert body["id"].isdecimal()
    assert body["object"] == "chat.completion"
    assert body["model"] == tiny.route
    (choice,) = body["choices"]
    assert list(choice) == ["finish_reason", "index", "message", "logprobs"]
    assert choice["finish_reason"] == "length"
    assert list(choice["message"]) == ["content", "role", "tool_calls"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    usage = body["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["prompt_tokens"] + 8 == usage["total_tokens"]


def test_greedy_output_is_identical_across_runs(tiny: EngineAdapter) -> None:
    body = chat_body(max_tokens=32)
    first, second = (_stream(tiny, body)[1] for _ in range(2))
    assert first.text() == second.text() != ""
    answers = [_post(tiny, "/v1/chat/completions", body).json() for _ in range(2)]
    contents = [a["choices"][0]["message"]["content"] for a in answers]
    assert contents[0] == contents[1]
    # The engine trims the non-streaming text's leading whitespace; the stream keeps it.
    assert contents[0] == first.text().lstrip()


def test_a_forced_nul_token_streams_as_u0000(tiny: EngineAdapter) -> None:
    nul = modelgen.nul_token_id(tiny.route)
    _, stream = _stream(tiny, chat_body(max_tokens=3, logit_bias={str(nul): 100}))
    assert stream.text() == "\x00" * 3
    assert b'"content":"\\u0000"' in stream.raw


def test_a_forced_eos_finishes_with_stop(tiny: EngineAdapter) -> None:
    eos = modelgen.eos_token_id(tiny.route)
    _, stream = _stream(tiny, chat_body(max_tokens=8, logit_bias={str(eos): 100}))
    last = stream.chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["usage"]["completion_tokens"] == 1
    assert "stop_sequence" not in last["choices"][0]


def test_a_stop_string_ends_the_stream_and_is_named(tiny: EngineAdapter) -> None:
    text = _stream(tiny, chat_body(max_tokens=16))[1].text()
    stop = text[4:7]
    _, stream = _stream(tiny, chat_body(max_tokens=16, stop=stop))
    choice = stream.chunks[-1]["choices"][0]
    assert (choice["finish_reason"], choice["stop_sequence"]) == ("stop", stop)
    assert stop not in stream.text()
    assert stream.events[-1] == "[DONE]"


def test_a_prompt_over_the_context_is_an_in_band_error_then_done(tiny: EngineAdapter) -> None:
    long = chat_body(messages=[{"role": "user", "content": "ka ri to mu " * 400}])
    response, stream = _stream(tiny, long)
    assert response.status_code == 200
    error, done = stream.events
    assert done == "[DONE]"
    assert list(error) == ["error"]
    assert error["error"]["type"] == "server_error"
    assert (error["error"]["param"], error["error"]["code"]) == (None, None)
    assert "Prompt sequence length is greater than" in error["error"]["message"]
    refused = _post(tiny, "/v1/chat/completions", long)
    assert refused.status_code == 422
    assert list(refused.json()) == ["message"]
    assert "Prompt sequence length is greater than" in refused.json()["message"]


def test_completions_answer_the_reference_shape_and_refuse_to_stream(
    tiny: EngineAdapter,
) -> None:
    body = {"prompt": "Once", "max_tokens": 5, "temperature": 0}
    answer = _post(tiny, "/v1/completions", body)
    assert answer.status_code == 200
    completion = answer.json()
    assert list(completion) == [
        "id", "choices", "created", "model", "system_fingerprint", "object", "usage",
    ]  # fmt: skip
    assert completion["object"] == "text_completion"
    assert list(completion["choices"][0]) == ["finish_reason", "index", "text", "logprobs"]
    assert completion["usage"]["completion_tokens"] == 5
    refused = _post(tiny, "/v1/completions", {**body, "stream": True})
    assert refused.status_code == 501
    assert "cannot stream" in refused.json()["message"]


@pytest.mark.parametrize(
    ("content", "headers", "status", "kind"),
    [
        (b"{}", {"content-type": "text/plain"}, 415, "text/plain"),
        (b"{not json", {"content-type": "application/json"}, 400, "text/plain"),
        (b'{"model": "default"}', {"content-type": "application/json"}, 422, "text/plain"),
        (b'{"messages": "hi", "max_tokens": "8"}', {"content-type": "application/json"}, 422,
         "text/plain"),
        (b'{"messages": "hi", "model": "other"}', {"content-type": "application/json"}, 500,
         "application/json"),
    ],
)  # fmt: skip
def test_bodies_the_server_refuses_are_refused_alike(
    tiny: EngineAdapter, content: bytes, headers: dict[str, str], status: int, kind: str
) -> None:
    answer = httpx.post(
        tiny.base_url + "/v1/chat/completions", content=content, headers=headers, timeout=10
    )
    assert answer.status_code == status
    assert answer.headers["content-type"].startswith(kind)


def test_unknown_routes_and_methods(tiny: EngineAdapter) -> None:
    assert httpx.get(tiny.base_url + "/v1/nothing", timeout=10).status_code == 404
    assert httpx.get(tiny.base_url + "/v1/chat/completions", timeout=10).status_code == 405
    assert httpx.get(tiny.base_url + "/health", timeout=10).text == "OK"


def test_a_body_over_50_mib_is_413(tiny: EngineAdapter) -> None:
    # Refused from the declared length, before any of the body is read (as axum does).
    sock = rawhttp.connect(tiny.port)
    try:
        sock.sendall(rawhttp.chat_post(None, [("content-length", str(50 * 1024 * 1024 + 1))]))
        answer = rawhttp.read_response(sock, close_wait_s=5)
    finally:
        sock.close()
    assert answer.status == 413
    assert answer.body == b"request body too large"
    assert answer.closed


def test_the_stats_count_finished_streams(tiny: EngineAdapter) -> None:
    before = tiny.stats()
    _stream(tiny, chat_body(max_tokens=5))
    after = tiny.stats()
    assert after["streams_started"] == before["streams_started"] + 1
    assert after["streams_finished"] == before["streams_finished"] + 1
    assert after["tokens_streamed"] == before["tokens_streamed"] + 5
    assert (after["active_streams"], after["open_streamers"]) == (0, 0)
    assert after["pid"] == tiny.pid


def test_requests_during_a_non_streaming_answer_are_all_answered(tiny: EngineAdapter) -> None:
    # The Runner is borrowed for a whole non-streaming call: calls on it take turns.
    body = chat_body(max_tokens=200)
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        answers = [pool.submit(_post, tiny, "/v1/chat/completions", body) for _ in range(3)]
        listings = [pool.submit(httpx.get, tiny.base_url + "/v1/models", timeout=30)]
        streams = [pool.submit(_stream, tiny, chat_body(max_tokens=20))]
        assert [f.result().status_code for f in answers] == [200, 200, 200]
        assert listings[0].result().json()["data"][1]["status"] == "loaded"
        assert streams[0].result()[1].events[-1] == "[DONE]"
    contents = {f.result().json()["choices"][0]["message"]["content"] for f in answers}
    assert len(contents) == 1  # greedy, whatever the order
