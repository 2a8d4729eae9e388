"""Policy tightening (spec §13, §14) through the real gateway: what the model
reads is bounded, nested objects are allowlisted, numbers are typed, text is a
modality, issuers are per tenant -- and a refusal names its field and never
reaches the worker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.config import UpstreamConfig
from gateway.core.errors import GatewayError
from gateway.testing.harness import SIM_ROUTE
from gateway.upstream.client import Upstream
from tests.support.evidence import PNG, media_part, staged
from tests.support.stack import API_KEY, Stack, chat_body, running_stack, worker_posts

BIG = "x" * 200_000
FUNCTION = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _refusal(stack: Stack, body: dict[str, Any], path: str = "/v1/chat/completions") -> Any:
    before = len(worker_posts(stack.sim))
    with stack.client() as client:
        response = client.post(path, json=body)
    assert len(worker_posts(stack.sim)) == before, "a refusal never reaches the worker"
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.fixture(scope="module")
def small_prompts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    mp = pytest.MonkeyPatch()
    from gateway.testing.harness import DEMO_SECRET_ENV
    from tests.support.jwt import HS_SECRET

    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    acme = {
        "limits": {"max_output_tokens": 64, "max_prompt_bytes": 1000, "max_body_bytes": 900_000}
    }
    try:
        with running_stack(tmp_path_factory.mktemp("bounds"), acme=acme) as stack:
            yield stack
    finally:
        mp.undo()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{**FUNCTION, "function": {"name": "f", "description": BIG}}]),
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "s", "schema": {"d": BIG}}},
        ),
        ("grammar", {"type": "regex", "value": BIG}),
        ("stop", [BIG]),
        ("logit_bias", {str(i): 1 for i in range(30_000)}),
        ("dry_sequence_breakers", [BIG]),
    ],
)
def test_everything_the_model_reads_counts_toward_max_prompt_bytes(
    small_prompts: Stack, field: str, value: Any
) -> None:
    error = _refusal(small_prompts, chat_body("hi", **{field: value}))
    assert error["code"] == "prompt_too_large"


def test_suffix_counts_on_completions(small_prompts: Stack) -> None:
    body = {"model": "gemma-4-mm", "prompt": "once", "suffix": BIG}
    assert _refusal(small_prompts, body, "/v1/completions")["code"] == "prompt_too_large"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{**FUNCTION, "function": {"name": "f", "bar": 1}}]}, "tools[0].function.bar"),
        ({"tools": [{**FUNCTION, "cache_control": {}}]}, "tools[0].cache_control"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}, "x": 1}}, "tool_choice.x"),
        ({"messages": [{"role": "user", "content": "hi", "foo": 1}]}, "messages[0].foo"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "z": 0}]}]},
            "messages[0].content[0].z",
        ),
        ({"response_format": {"type": "json_object", "extra": True}}, "response_format.extra"),
        ({"stream_options": {"include_usage": True, "chunk_size": 2}}, "stream_options.chunk_size"),
        ({"web_search_options": {}}, "web_search_options"),
    ],
)
def test_nested_fields_are_allowlisted_and_named(
    small_prompts: Stack, extra: dict[str, Any], param: str
) -> None:
    error = _refusal(small_prompts, chat_body("hi", **extra))
    assert (error["code"], error["param"]) == ("unsupported_field", param)


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", True), ("n", 1.0), ("temperature", "1"), ("top_k", 2.5), ("seed", False)],
)
def test_numbers_are_type_checked(small_prompts: Stack, field: str, value: Any) -> None:
    error = _refusal(small_prompts, chat_body("hi", **{field: value}))
    assert (error["code"], error["param"]) == ("invalid_request", field)


def test_harmless_fields_are_accepted_and_not_forwarded(small_prompts: Stack) -> None:
    assistant = {
        "role": "assistant",
        "content": "earlier answer",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": None,
    }
    body = chat_body(
        "hi",
        messages=[{"role": "user", "content": "q"}, assistant, {"role": "user", "content": "hi"}],
        store=True,
        metadata={"k": "v"},
        service_tier="auto",
        safety_identifier="u-1",
        prompt_cache_key="c",
        user="end-user-7",
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    with small_prompts.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    sent = worker_posts(small_prompts.sim)[-1].json
    assert isinstance(sent, dict)
    for name in ("store", "metadata", "service_tier", "safety_identifier", "prompt_cache_key"):
        assert name not in sent
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["user"] == "end-user-7", "user is forwarded"
    # The SDK's null extras are dropped, and a null tool_calls too: a null is
    # the field's absence (spec §24).
    assert sent["messages"][1] == {"role": "assistant", "content": "earlier answer"}
    refused = _refusal(small_prompts, chat_body("hi", messages=[{**assistant, "refusal": "no"}]))
    assert (refused["code"], refused["param"]) == ("unsupported_field", "messages[0].refusal")


def test_text_is_a_modality(tmp_path: Path) -> None:
    acme = {"modalities": ["image"]}
    with running_stack(tmp_path, acme=acme) as stack:
        error = _refusal(stack, chat_body("hello"))
        assert (error["code"], error["param"]) == ("modality_not_allowed", "messages")
        record = staged(stack, PNG, "image/png")
        image_only = chat_body(
            messages=[
                {"role": "user", "content": [media_part("image", f"evidence:{record['id']}")]}
            ]
        )
        with stack.client() as client:
            assert client.post("/v1/chat/completions", json=image_only).status_code == 200
        completion = {"model": "gemma-4-mm", "prompt": "hi"}
        assert _refusal(stack, completion, "/v1/completions")["code"] == "modality_not_allowed"


def test_a_tenant_takes_tokens_only_from_its_issuers(tmp_path: Path) -> None:
    from tests.support.stack import DEV_ISSUER

    with running_stack(tmp_path, acme={"issuers": [DEV_ISSUER]}) as stack:
        with stack.client(stack.rs256()) as client:
            response = client.post("/v1/chat/completions", json=chat_body())
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "issuer_not_allowed"
        for token in (stack.dev_token(), API_KEY):
            with stack.client(token) as client:
                assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
        # Another tenant without `issuers` takes tokens of any configured issuer.
        with stack.client(stack.rs256(tenant="globex")) as client:
            assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200


def test_metrics_on_their_own_listener(tmp_path: Path) -> None:
    metrics = {"path": "/metrics", "listen": {"host": "127.0.0.1", "port": 0}}
    with running_stack(tmp_path, metrics=metrics) as stack:
        listener = stack.runtime.metrics_listener
        assert listener is not None
        scrape = httpx.get(f"http://127.0.0.1:{listener.port}/metrics", timeout=5)
        assert scrape.status_code == 200 and "gateway_requests_total" in scrape.text
        assert httpx.get(f"http://127.0.0.1:{listener.port}/other", timeout=5).status_code == 404
        assert httpx.get(f"{stack.url}/metrics", timeout=5).status_code == 404


async def test_a_worker_echoing_two_request_ids_is_refused() -> None:
    """The worker sets exactly one x-request-id: two means a crossed answer."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"x-request-id: r-1\r\nx-request-id: r-2\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream(UpstreamConfig(base_url=f"http://127.0.0.1:{port}", route=SIM_ROUTE))
    try:
        body = orjson.dumps({"model": SIM_ROUTE, "messages": []})
        with pytest.raises(GatewayError) as refused:
            await upstream.open_stream("/v1/chat/completions", body, "r-1")
        assert refused.value.code == "upstream_protocol_error"
    finally:
        await upstream.aclose()
        server.close()
        await server.wait_closed()
