"""OpenTelemetry spans of real requests through the gateway, exported in memory.

The gateway runs under uvicorn on loopback in front of the simulator, with
:class:`gateway.observe.otel.OtelTracing` on a synchronous in-memory exporter: each
test reads back the spans of its one request (the server span ends after
the response is sent, so it is polled for).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.observe.otel import OtelTracing
from gateway.observe.tracing import NO_TRACING, NS
from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, chat_body, running_stack, worker_posts

ENDPOINTS = ["chat.completions", "completions", "responses", "embeddings", "models", "evidence"]
ALIAS = "gemma-4-mm"
PROMPT = "a prompt no span may carry"
FAST = {"first_event_timeout_s": 0.6, "idle_timeout_s": 0.6, "total_timeout_s": 5}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, exporter: InMemorySpanExporter
) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    tracing = OtelTracing([SimpleSpanProcessor(exporter)], "test")
    try:
        with running_stack(
            tmp_path_factory.mktemp("otel"),
            acme={"endpoints": ENDPOINTS},
            globex={"endpoints": ENDPOINTS, "limits": {"requests_per_minute": 1}},
            upstream=FAST,
            tracing=tracing,
        ) as running:
            yield running
    finally:
        mp.undo()


def _traceparent(trace_id: str = TRACE_ID, span_id: str = PARENT_ID) -> str:
    return f"00-{trace_id}-{span_id}-01"


def _trace_of(exporter: InMemorySpanExporter, request_id: str) -> list[ReadableSpan]:
    """The spans of the trace whose server span names the request (polled: the
    server span ends once the response has been handed to the server)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        spans = exporter.get_finished_spans()
        servers = [s for s in spans if _attrs(s).get(NS + "request_id") == request_id]
        if servers:
            [server] = servers
            return [s for s in spans if s.context.trace_id == server.context.trace_id]
        time.sleep(0.01)
    raise AssertionError("no server span for the request")


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    [span] = [s for s in spans if s.name == name]
    return span


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_streamed_chat_continues_the_callers_trace(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    with stack.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json=chat_body(f"{PROMPT} [[sim chunks=5]]", stream=True),
            headers={"traceparent": _traceparent()},
        )
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    receipt = stack.receipt(request_id)
    spans = _trace_of(exporter, request_id)
    server = _one(spans, f"chat {ALIAS}")
    assert server.kind is SpanKind.SERVER
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert server.parent is not None and f"{server.parent.span_id:016x}" == PARENT_ID
    attrs = _attrs(server)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == ALIAS
    assert attrs["gen_ai.provider.name"] == "mistral.rs"
    assert attrs["gen_ai.usage.input_tokens"] == receipt["usage"]["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == receipt["usage"]["completion_tokens"] > 0
    assert attrs["gen_ai.response.finish_reasons"] == (receipt["finish_reason"],)
    assert attrs["http.response.status_code"] == 200
    assert attrs[NS + "tenant"] == "acme"
    assert attrs[NS + "outcome"] == "complete"
    assert attrs[NS + "upstream"] == "default"
    assert "error.type" not in attrs
    assert server.status.status_code is StatusCode.UNSET

    # Its children: rate limits, the admission wait, the worker call.
    children = {s.name: s for s in spans if s.parent and s.parent.span_id == server.context.span_id}
    assert set(children) == {"gateway.limits", "gateway.admission", "POST /v1/chat/completions"}
    worker = children["POST /v1/chat/completions"]
    assert worker.kind is SpanKind.CLIENT
    assert _attrs(worker)["server.address"] == "127.0.0.1"
    assert _attrs(worker)["server.port"] == stack.sim.port
    assert _attrs(children["gateway.admission"])[NS + "upstream"] == "default"
    for child in children.values():
        assert server.start_time is not None and child.start_time is not None
        assert server.end_time is not None and child.end_time is not None
        assert server.start_time <= child.start_time <= child.end_time <= server.end_time

    # The worker was sent the worker call's own traceparent, in the caller's trace.
    [post] = [r for r in worker_posts(stack.sim) if r.headers["x-request-id"] == request_id]
    assert post.headers["traceparent"] == _traceparent(TRACE_ID, f"{worker.context.span_id:016x}")


def test_a_request_without_traceparent_starts_a_trace(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat_body("hi [[sim chunks=2]]"))
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    spans = _trace_of(exporter, request_id)
    server = _one(spans, f"chat {ALIAS}")
    assert server.parent is None
    assert f"{server.context.trace_id:032x}" != TRACE_ID
    [post] = [r for r in worker_posts(stack.sim) if r.headers["x-request-id"] == request_id]
    assert post.headers["traceparent"].split("-")[1] == f"{server.context.trace_id:032x}"


@pytest.mark.parametrize(
    "given",
    [
        "00-" + "0" * 32 + "-" + PARENT_ID + "-01",  # all-zero trace id: invalid
        "00-" + TRACE_ID + "-" + PARENT_ID,  # no flags
        "zz-" + TRACE_ID + "-" + PARENT_ID + "-01",
        "00-" + TRACE_ID.upper() + "-" + PARENT_ID + "-01",
        "ff-" + TRACE_ID + "-" + PARENT_ID + "-01",  # version ff is forbidden
        "00-" + TRACE_ID + "-" + PARENT_ID + "-01" + "x" * 600,
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace(
    stack: Stack, exporter: InMemorySpanExporter, given: str
) -> None:
    with stack.client() as client:
        response = client.post(
            "/v1/chat/completions", json=chat_body("hi"), headers={"traceparent": given}
        )
    request_id = response.headers["x-request-id"]
    server = _one(_trace_of(exporter, request_id), f"chat {ALIAS}")
    assert server.parent is None
    [post] = [r for r in worker_posts(stack.sim) if r.headers["x-request-id"] == request_id]
    assert post.headers["traceparent"] != given
    assert post.headers["traceparent"].split("-")[1] == f"{server.context.trace_id:032x}"


def test_two_traceparent_headers_are_neither_continued(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    trace_id = "cd" * 16
    headers = [
        ("traceparent", _traceparent(trace_id)),
        ("traceparent", _traceparent(trace_id, "1" * 16)),
    ]
    with stack.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json=chat_body("hi"),
            headers=httpx.Headers(headers),
        )
    server = _one(_trace_of(exporter, response.headers["x-request-id"]), f"chat {ALIAS}")
    assert server.parent is None


def test_an_authentication_failure_is_a_span_without_genai_attributes(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    response = httpx.post(
        stack.url + "/v1/chat/completions",
        json=chat_body(PROMPT),
        headers={"authorization": "Bearer not-a-token", "traceparent": _traceparent("ab" * 16)},
    )
    assert response.status_code == 401
    [span] = _trace_of(exporter, response.headers["x-request-id"])
    assert span.name == "POST chat.completions"
    attrs = _attrs(span)
    assert attrs["error.type"] == "invalid_token"
    assert attrs["http.response.status_code"] == 401
    assert "gen_ai.operation.name" not in attrs
    # A refusal is the caller's error, not the server's.
    assert span.status.status_code is StatusCode.UNSET


def test_a_rate_limited_request_ends_in_the_limits_span(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    token = stack.rs256(tenant="globex")
    with stack.client(token) as client:
        responses = [client.post("/v1/chat/completions", json=chat_body("hi")) for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 429]
    spans = _trace_of(exporter, responses[1].headers["x-request-id"])
    limits = _one(spans, "gateway.limits")
    assert _attrs(limits)["error.type"] == "rate_limited"
    assert limits.status.status_code is StatusCode.UNSET
    assert not [s for s in spans if s.name.startswith("gateway.admission")]
    assert _attrs(_one(spans, f"chat {ALIAS}"))["error.type"] == "rate_limited"


def test_a_stream_ended_by_an_error_event_is_an_error(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    with stack.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json=chat_body("go [[sim fault=error_json chunks=6]]", stream=True),
        )
    assert response.status_code == 200
    spans = _trace_of(exporter, response.headers["x-request-id"])
    server = _one(spans, f"chat {ALIAS}")
    worker = _one(spans, "POST /v1/chat/completions")
    for span in (server, worker):
        assert _attrs(span)["error.type"] == "upstream_error"
        assert span.status.status_code is StatusCode.ERROR
    assert _attrs(server)[NS + "outcome"] == "upstream_error"


def test_a_caller_leaving_ends_the_worker_call_canceled(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    body = json.dumps(chat_body("[[sim chunks=200 delay_ms=20]]", stream=True)).encode()
    host, port = "127.0.0.1", int(stack.url.rsplit(":", 1)[1])
    before = len(worker_posts(stack.sim))
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + stack.rs256().encode() + b"\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        sock.recv(4096)
    assert stack.sim.wait_for(lambda: len(worker_posts(stack.sim)) > before, 5)
    request_id = worker_posts(stack.sim)[-1].headers["x-request-id"]
    spans = _trace_of(exporter, request_id)
    worker = _one(spans, "POST /v1/chat/completions")
    assert _attrs(worker)["error.type"] == "canceled"
    assert worker.status.status_code is StatusCode.UNSET
    assert _attrs(_one(spans, f"chat {ALIAS}"))[NS + "outcome"] == "canceled"


def test_each_endpoint_names_its_operation(stack: Stack, exporter: InMemorySpanExporter) -> None:
    sdk = stack.sdk()
    calls: dict[str, Callable[[], Any]] = {
        "text_completion": lambda: sdk.completions.with_raw_response.create(
            model=ALIAS, prompt="hi", max_tokens=4
        ),
        "embeddings": lambda: sdk.embeddings.with_raw_response.create(model=ALIAS, input="hi"),
        "chat": lambda: sdk.responses.with_raw_response.create(model=ALIAS, input="hi"),
    }
    for operation, call in calls.items():
        raw = call()
        spans = _trace_of(exporter, raw.headers["x-request-id"])
        server = _one(spans, f"{operation} {ALIAS}")
        assert _attrs(server)["gen_ai.operation.name"] == operation
        assert server.kind is SpanKind.SERVER


def test_other_api_requests_are_spans_and_probes_are_not(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    with stack.client() as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200
        # On the same connection: the probe's request has ended when this one is read.
        listing = client.get("/v1/evidence")
        assert listing.status_code == 200
    [span] = _trace_of(exporter, listing.headers["x-request-id"])
    assert span.name == "GET evidence"
    assert _attrs(span)["http.request.method"] == "GET"
    probe_id = ready.headers["x-request-id"]
    assert not [
        s for s in exporter.get_finished_spans() if _attrs(s).get(NS + "request_id") == probe_id
    ]


def test_no_span_carries_a_prompt_or_a_token(stack: Stack, exporter: InMemorySpanExporter) -> None:
    token = stack.rs256()
    with stack.client(token) as client:
        response = client.post("/v1/chat/completions", json=chat_body(f"{PROMPT} [[sim chunks=3]]"))
    spans = _trace_of(exporter, response.headers["x-request-id"])
    text = "\n".join(s.to_json() for s in exporter.get_finished_spans())
    assert spans and PROMPT not in text and token not in text
    assert "Bearer" not in text


def test_tracing_is_off_without_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEMO_SECRET_ENV, HS_SECRET)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    with running_stack(tmp_path) as stack:
        assert stack.runtime.tracing is NO_TRACING
