"""What SDKs and frameworks do that the gateway must take (spec §24 "Callers'
habits", issue 36), and the contract slips the black-box tests of §19-§21
found: each through the real gateway in front of the simulator."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.evidence import PNG
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack, worker_posts

ENDPOINTS = ["chat.completions", "completions", "responses", "messages", "embeddings", "models"]
MAX_PROMPT_BYTES = 4096
MAX_BODY_BYTES = 65_536


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    limits = {
        "max_output_tokens": 512,
        "requests_per_minute": 6000,
        "max_prompt_bytes": MAX_PROMPT_BYTES,
        "max_body_bytes": MAX_BODY_BYTES,
    }
    try:
        with running_stack(
            tmp_path_factory.mktemp("habits"),
            acme={"endpoints": ENDPOINTS, "limits": limits},
            # one request a minute: the second is refused by the rate limit
            globex={"endpoints": ENDPOINTS, "limits": {"requests_per_minute": 1}},
        ) as running:
            yield running
    finally:
        mp.undo()


def _anthropic(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=stack.rs256(), max_retries=0, timeout=10)


def _post(stack: Stack, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    with stack.client(**{}) as client:
        return client.post(path, json=body, headers=headers)


def _last_worker_body(stack: Stack, path: str) -> dict[str, Any]:
    seen = [p for p in worker_posts(stack.sim) if p.path == path]
    assert seen and seen[-1].json is not None
    body: dict[str, Any] = seen[-1].json
    return body


# -- an explicit null is the field's absence ---------------------------------------

NULLS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        "/v1/chat/completions",
        {
            "model": "gemma-4-mm",
            "messages": [{"role": "user", "content": "hi", "name": None}],
            "seed": None,
            "logprobs": None,
            "stop": None,
            "logit_bias": None,
            "tools": None,
            "tool_choice": None,
            "response_format": None,
            "max_tokens": None,
            "temperature": None,
            "stream_options": None,
            "web_search_options": None,
        },
    ),
    "completions": (
        "/v1/completions",
        "/v1/completions",
        {
            "model": "gemma-4-mm",
            "prompt": "Once",
            "seed": None,
            "logprobs": None,
            "stop": None,
            "logit_bias": None,
            "suffix": None,
            "echo": None,
            "best_of": None,
            "n": None,
        },
    ),
    "responses": (
        "/v1/responses",
        "/v1/responses",
        {
            "model": "gemma-4-mm",
            "input": "hi",
            "instructions": None,
            "previous_response_id": None,
            "tools": None,
            "text": None,
            "reasoning": None,
            "truncation": None,
            "user": None,
            "metadata": None,
            "store": None,
            "stop": None,
        },
    ),
    "messages": (
        "/v1/messages",
        "/v1/chat/completions",
        {
            "model": "gemma-4-mm",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "system": None,
            "stop_sequences": None,
            "temperature": None,
            "tools": None,
            "tool_choice": None,
            "thinking": None,
            "metadata": None,
        },
    ),
    "embeddings": (
        "/v1/embeddings",
        "/v1/embeddings",
        {
            "model": "gemma-4-mm",
            "input": "some text",
            "encoding_format": None,
            "user": None,
            "dimensions": None,
        },
    ),
}


@pytest.mark.parametrize("endpoint", sorted(NULLS))
def test_an_explicit_null_is_the_fields_absence(stack: Stack, endpoint: str) -> None:
    path, upstream, body = NULLS[endpoint]
    response = _post(stack, path, body)
    assert response.status_code == 200, response.text
    forwarded = _last_worker_body(stack, upstream)
    nulls = {k for k, v in body.items() if v is None}
    # Absent for the worker too (the gateway's own defaults apply instead).
    assert not any(forwarded.get(name) is None and name in forwarded for name in nulls)
    assert "seed" not in forwarded and "web_search_options" not in forwarded


def test_null_on_a_required_field_is_still_refused(stack: Stack) -> None:
    response = _post(stack, "/v1/chat/completions", {"model": "gemma-4-mm", "messages": None})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"


def test_an_assistant_turns_null_content_beside_its_tool_calls_reaches_the_worker(
    stack: Stack,
) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "model": "gemma-4-mm",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        ],
    }
    assert _post(stack, "/v1/chat/completions", body).status_code == 200
    forwarded = _last_worker_body(stack, "/v1/chat/completions")
    assistant = forwarded["messages"][1]
    assert "content" in assistant and assistant["content"] is None
    assert "refusal" not in assistant


def test_the_sdk_sending_none_for_seed_logprobs_and_stop_is_served(stack: Stack) -> None:
    completion = stack.sdk().completions.create(
        model="gemma-4-mm", prompt="Once", max_tokens=4, seed=None, logprobs=None, stop=None
    )
    assert completion.choices[0].text is not None


# -- Responses objects echo the request -------------------------------------------


def _store(response: Any) -> Any:
    """``store`` (the SDK's Response type has no field for it: an extra)."""
    return response.model_dump()["store"]


def test_responses_objects_echo_the_request_and_say_whether_they_are_kept(stack: Stack) -> None:
    sdk = stack.sdk()
    first = sdk.responses.create(model="gemma-4-mm", input="My name is Ada.")
    assert _store(first) is True and first.previous_response_id is None
    echo: dict[str, Any] = {
        "instructions": "Answer briefly.",
        "metadata": {"ticket": "T-1"},
        "user": "user-7",
        "truncation": "auto",
    }
    second = sdk.responses.create(
        model="gemma-4-mm", input="What is my name?", previous_response_id=first.id, **echo
    )
    for found in (second, sdk.responses.retrieve(second.id)):
        assert found.previous_response_id == first.id
        assert found.instructions == "Answer briefly."
        assert found.metadata == {"ticket": "T-1"}
        assert found.user == "user-7"
        assert found.truncation == "auto"
        assert _store(found) is True
    # Metadata is the gateway's to echo: the worker never gets it.
    assert "metadata" not in _last_worker_body(stack, "/v1/responses")

    events = list(
        sdk.responses.create(model="gemma-4-mm", input="hi", stream=True, store=False, **echo)
    )
    responses = [e.response for e in events if hasattr(e, "response")]
    assert responses and all(_store(r) is False for r in responses)
    assert all(r.metadata == {"ticket": "T-1"} for r in responses)
    assert all(r.instructions == "Answer briefly." and r.user == "user-7" for r in responses)


def test_responses_metadata_is_bounded_like_openais(stack: Stack) -> None:
    body = {"model": "gemma-4-mm", "input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}
    response = _post(stack, "/v1/responses", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "metadata"


def test_retrieving_a_response_as_a_stream_is_refused(stack: Stack) -> None:
    sdk = stack.sdk()
    kept = sdk.responses.create(model="gemma-4-mm", input="hi")
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.retrieve(kept.id, stream=True)
    assert info.value.code == "unsupported_field" and info.value.param == "stream"
    # Without the flag (or with it false) the kept object is answered.
    with stack.client() as client:
        assert client.get(f"/v1/responses/{kept.id}", params={"stream": "false"}).status_code == 200


# -- request-id on the Anthropic routes --------------------------------------------


def test_anthropic_answers_carry_request_id_for_the_sdk(stack: Stack) -> None:
    with _anthropic(stack) as client:
        message = client.messages.create(
            model="gemma-4-mm", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        assert message._request_id is not None and message._request_id.startswith("req_")
        count = client.messages.count_tokens(
            model="gemma-4-mm", messages=[{"role": "user", "content": "hi"}]
        )
        assert count._request_id is not None
        with pytest.raises(anthropic.NotFoundError) as info:
            client.messages.create(
                model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert info.value.request_id is not None
        with client.messages.stream(
            model="gemma-4-mm", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            assert stream.response.headers["request-id"] == stream.response.headers["x-request-id"]
    with httpx.Client(base_url=stack.url) as raw:  # unauthenticated: an error, still named
        refused = raw.post("/v1/messages", json={})
    assert refused.status_code == 401
    assert refused.headers["request-id"] == refused.headers["x-request-id"]
    # Only the Anthropic paths: an OpenAI answer keeps its one header.
    assert "request-id" not in _post(stack, "/v1/embeddings", NULLS["embeddings"][2]).headers


# -- unknown sub-paths -------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/responses/compact", "/v1/responses/resp_x", "/v1/evidence/ev_x", "/v1/models/x"]
)
def test_a_post_to_an_unknown_sub_path_is_404_never_405(stack: Stack, path: str) -> None:
    response = _post(stack, path, {"model": "gemma-4-mm", "input": "hi"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_the_sdks_compact_is_the_sdks_not_found(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        stack.sdk().post("/responses/compact", body={"model": "gemma-4-mm"}, cast_to=object)
    assert info.value.code == "not_found"


def test_a_wrong_method_on_a_known_route_is_still_405(stack: Stack) -> None:
    with stack.client() as client:
        assert client.put("/v1/responses/resp_x").status_code == 405
        assert client.get("/v1/chat/completions").status_code == 405


# -- refusals that name what they refuse -------------------------------------------


def test_inline_data_refused_says_inline_data_not_url(stack: Stack) -> None:
    image: dict[str, Any] = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(PNG).decode(),
        },
    }
    messages: Any = [{"role": "user", "content": [image, {"type": "text", "text": "x"}]}]
    with _anthropic(stack) as client, pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="gemma-4-mm", max_tokens=8, messages=messages)
    error = info.value.body["error"]  # type: ignore[index]
    assert error["code"] == "caller_url_forbidden"
    assert "inline data" in error["message"].lower() and "URL" not in error["message"]
    chat_part = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    body = {"model": "gemma-4-mm", "messages": [{"role": "user", "content": [chat_part]}]}
    url = _post(stack, "/v1/chat/completions", body).json()["error"]
    assert url["code"] == "caller_url_forbidden" and "URL" in url["message"]


LONG = "x" * (MAX_PROMPT_BYTES + 1)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
        ("/v1/completions", {"prompt": LONG}, "prompt"),
        ("/v1/responses", {"input": LONG}, "input"),
        ("/v1/embeddings", {"input": LONG}, "input"),
        (
            "/v1/messages",
            {"max_tokens": 8, "messages": [{"role": "user", "content": LONG}]},
            "messages",
        ),
        (
            "/v1/messages",
            {"max_tokens": 8, "system": LONG, "messages": [{"role": "user", "content": "hi"}]},
            "system",
        ),
    ],
)
def test_prompt_too_large_names_its_param(
    stack: Stack, path: str, body: dict[str, Any], param: str
) -> None:
    response = _post(stack, path, {"model": "gemma-4-mm", **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "prompt_too_large" and error["param"] == param


# -- contract slips (§19, §20) -----------------------------------------------------


def test_a_messages_body_over_max_body_bytes_is_request_too_large(stack: Stack) -> None:
    content = "y" * (MAX_BODY_BYTES + 1)
    with _anthropic(stack) as client, pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(
            model="gemma-4-mm", max_tokens=8, messages=[{"role": "user", "content": content}]
        )
    assert info.value.status_code == 413
    error = info.value.body["error"]  # type: ignore[index]
    assert error["type"] == "request_too_large" and error["code"] == "body_too_large"
    # The OpenAI paths keep OpenAI's type for the same refusal.
    body = {"model": "gemma-4-mm", "messages": [{"role": "user", "content": content}]}
    openai_shaped = _post(stack, "/v1/chat/completions", body)
    assert openai_shaped.status_code == 413
    assert openai_shaped.json()["error"]["type"] == "invalid_request_error"


def test_a_rate_limited_request_has_its_limits_timing(stack: Stack) -> None:
    token = stack.rs256("globex")
    body = {"model": "gemma-4-mm", "messages": [{"role": "user", "content": "hi"}]}
    with stack.client(token) as client:
        statuses = []
        for _ in range(3):  # bounded: the second already meets the limit of one a minute
            response = client.post("/v1/chat/completions", json=body)
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
    assert statuses[-1] == 429 and response.json()["error"]["code"] == "rate_limited"
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["error_code"] == "rate_limited"
    assert receipt["timings_ms"]["limits"] is not None and receipt["timings_ms"]["limits"] >= 0
    assert receipt["timings_ms"]["admission"] is None  # the stage after it never ran
