"""The tracing seam's pure parts: what the environment turns on, the span
status rule, the attributes taken from a receipt, the no-op span."""

from __future__ import annotations

import asyncio

import pytest

from gateway.apis.usage import Usage
from gateway.books.receipts import Receipt
from gateway.core.errors import GatewayError
from gateway.observe.tracing import (
    NO_SPAN,
    NO_TRACING,
    NS,
    TracingSettings,
    failed,
    settings_from_env,
    step,
)
from gateway.pipeline.spans import request_attributes


def test_tracing_is_off_unless_an_exporter_is_named() -> None:
    assert settings_from_env({}) == TracingSettings()
    assert not settings_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}).enabled
    assert not settings_from_env({"OTEL_TRACES_EXPORTER": "none"}).enabled
    assert not settings_from_env({"OTEL_TRACES_EXPORTER": " "}).enabled


def test_exporters_named_are_taken_once_in_order() -> None:
    settings = settings_from_env({"OTEL_TRACES_EXPORTER": "console, OTLP,console"})
    assert settings.exporters == ("console", "otlp")
    assert settings.warnings == ()


def test_sdk_disabled_wins() -> None:
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"}
    assert not settings_from_env(env).enabled


def test_unsupported_exporters_and_protocols_are_named_not_fatal() -> None:
    settings = settings_from_env({"OTEL_TRACES_EXPORTER": "zipkin,otlp"})
    assert settings.exporters == ("otlp",)
    assert settings.warnings == (
        "OTEL_TRACES_EXPORTER: 'zipkin' is not supported (otlp, console, none)",
    )
    grpc = settings_from_env(
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert not grpc.enabled
    assert grpc.warnings == (
        "OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' is not supported (http/protobuf)",
    )
    # The traces-specific variable wins over the general one, as in the SDK.
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    assert settings_from_env(env).exporters == ("otlp",)


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (200, None, False),
        (400, "invalid_request", False),  # the caller's refusal: named, not the server's error
        (429, "rate_limited", False),
        (503, "upstream_not_ready", True),
        (502, "upstream_error", True),
        (200, "upstream_protocol_error", True),  # a stream ended by an error event
        (0, None, False),  # the caller left before a head
    ],
)
def test_failed(status: int, code: str | None, expected: bool) -> None:
    assert failed(status, code) is expected


def test_request_attributes_follow_the_genai_conventions() -> None:
    receipt = Receipt(
        request_id="req_1",
        tenant="acme",
        subject="svc",
        endpoint="chat.completions",
        serve_identity="sha256:x",
        model_alias="small",
        route="org/small",
        upstream="default",
        max_tokens=64,
        stream=True,
        outcome="complete",
        finish_reason="stop",
        usage=Usage(12, 5, 17, "reported"),
        ttft_ms=1.5,
    )
    attributes = request_attributes(receipt, "chat")
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "mistral.rs",
        "gen_ai.request.model": "small",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.response.finish_reasons": ["stop"],
        NS + "upstream": "default",
        NS + "stream": True,
        NS + "outcome": "complete",
        NS + "usage_source": "reported",
        NS + "ttft_ms": 1.5,
    }


def test_request_attributes_of_a_refused_request_leave_out_what_is_unknown() -> None:
    receipt = Receipt("req_2", "acme", "svc", "chat.completions", None, outcome="rejected")
    attributes = request_attributes(receipt, "chat")
    unknown = {k for k, v in attributes.items() if v is None}
    assert "gen_ai.usage.input_tokens" in unknown
    assert "gen_ai.response.finish_reasons" in unknown
    assert attributes[NS + "outcome"] == "rejected"


def test_the_no_op_span_and_tracing_do_nothing() -> None:
    assert (
        NO_TRACING.start("POST", [(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")])
        is NO_SPAN
    )
    child = NO_SPAN.child("x", kind="client", attributes={"a": 1})
    assert child is NO_SPAN
    assert NO_SPAN.traceparent() is None
    NO_SPAN.set({"a": 1})
    NO_SPAN.end(name="y", error="e", failed=True)
    NO_TRACING.close(0)


class _Recorder:
    """A Span that remembers how it was ended."""

    def __init__(self) -> None:
        self.children: list[_Recorder] = []
        self.ended: dict[str, object] | None = None
        self.name = ""

    def child(self, name: str, *, kind: str = "internal", attributes: object = None) -> _Recorder:
        child = _Recorder()
        child.name = name
        self.children.append(child)
        return child

    def set(self, attributes: object) -> None:
        pass

    def traceparent(self) -> bytes | None:
        return None

    def end(
        self, *, name: str | None = None, error: str | None = None, failed: bool = False
    ) -> None:
        assert self.ended is None
        self.ended = {"error": error, "failed": failed}


def test_step_ends_its_span_with_what_happened() -> None:
    parent = _Recorder()
    with step(parent, "ok"):
        pass
    with pytest.raises(GatewayError), step(parent, "refused"):
        raise GatewayError("rate_limited")
    with pytest.raises(GatewayError), step(parent, "down"):
        raise GatewayError("upstream_unavailable")
    with pytest.raises(asyncio.CancelledError), step(parent, "left"):
        raise asyncio.CancelledError
    with pytest.raises(KeyError), step(parent, "bug"):
        raise KeyError("x")
    assert [(c.name, c.ended) for c in parent.children] == [
        ("ok", {"error": None, "failed": False}),
        ("refused", {"error": "rate_limited", "failed": False}),
        ("down", {"error": "upstream_unavailable", "failed": True}),
        ("left", {"error": "canceled", "failed": False}),
        ("bug", {"error": "KeyError", "failed": True}),
    ]


def test_a_step_without_tracing_builds_no_span() -> None:
    with step(NO_SPAN, "gateway.limits", {"a": 1}) as span:
        assert span is NO_SPAN


def test_no_path_in_the_attributes() -> None:
    receipt = Receipt("req_3", "acme", "svc", "chat.completions", None, route="/srv/models/x")
    assert "/srv/models/x" not in request_attributes(receipt, "chat").values()
