"""Foundation: authenticated forwarding through the real gateway (issue 2).

Every test talks to a real uvicorn server on 127.0.0.1 in front of the
protocol simulator; the official ``openai`` SDK is one of the clients.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from gateway.testing.harness import SIM_ROUTE
from tests.support.jwt import RSA1_PUBLIC_PEM, make_claims, sign_raw, sign_rs256
from tests.support.stack import API_KEY, Stack, chat_body, sse_data, worker_posts


def _sdk(stack: Stack, token: str) -> openai.OpenAI:
    return stack.sdk(token)


@pytest.mark.parametrize("credential", ["rs256", "hs256", "api_key"])
def test_sdk_chat_and_completions_stream_and_not(stack: Stack, credential: str) -> None:
    token = {"rs256": stack.rs256(), "hs256": stack.dev_token(), "api_key": API_KEY}[credential]
    client = _sdk(stack, token)
    chat = client.chat.completions.create(
        model="gemma-4-mm", messages=[{"role": "user", "content": "hi [[sim chunks=4]]"}]
    )
    assert chat.choices[0].finish_reason == "stop"
    assert chat.model == "gemma-4-mm"
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    streamed = list(
        client.chat.completions.create(
            model="gemma-4-mm",
            messages=[{"role": "user", "content": "hi [[sim chunks=4]]"}],
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content
    assert all(c.model == "gemma-4-mm" for c in streamed)
    assert all(c.usage is None for c in streamed), "usage only when the caller asks"
    completion = client.completions.create(model="gemma-4-mm", prompt="once [[sim chunks=3]]")
    assert completion.choices[0].text
    assert completion.usage is not None
    streamed_completion = list(
        client.completions.create(model="gemma-4-mm", prompt="once [[sim chunks=3]]", stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed_completion) == completion.choices[0].text


def test_worker_gets_exact_route_and_no_credentials(stack: Stack) -> None:
    token = stack.rs256()
    with stack.client(token) as client:
        # The same credential as x-api-key too (spec §19): neither reaches the worker.
        response = client.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers={"x-request-id": "trace-42", "cookie": "session=x", "x-api-key": token},
        )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-42"
    [seen] = worker_posts(stack.sim)
    assert seen.json is not None
    assert seen.json["model"] == SIM_ROUTE
    assert seen.json["stream"] is True
    assert seen.json["stream_options"] == {"include_usage": True}
    assert seen.json["max_tokens"] == 512
    assert "authorization" not in seen.headers
    assert "cookie" not in seen.headers and "x-api-key" not in seen.headers
    assert seen.headers["x-request-id"] == "trace-42"


def test_bad_request_id_is_replaced(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post(
            "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "bad id/../x"}
        )
    assert response.headers["x-request-id"].startswith("req_")


def test_stream_with_usage_requested(stack: Stack) -> None:
    body = chat_body("x [[sim chunks=3]]", stream=True, stream_options={"include_usage": True})
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    import json

    chunks = [json.loads(d) for d in sse_data(response.text)[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])


def test_models_lists_only_the_tenants_aliases(stack: Stack) -> None:
    with stack.client() as client:
        listing = client.get("/v1/models").json()
    assert [m["id"] for m in listing["data"]] == ["gemma-4-mm"]
    assert listing["data"][0]["status"] == "loaded"


def _now() -> int:
    return int(time.time())


BAD_TOKENS: dict[str, Any] = {
    "expired": lambda: sign_rs256(make_claims(now=_now() - 1000, ttl=100)),
    "not_yet_valid": lambda: sign_rs256(make_claims(nbf=_now() + 600)),
    "wrong_audience": lambda: sign_rs256(make_claims(aud="someone-else")),
    "wrong_issuer": lambda: sign_rs256(make_claims(iss="https://evil.test")),
    "alg_none": lambda: sign_raw({"alg": "none", "kid": "k1"}, make_claims(), None),
    "hs256_with_rsa_public_key": lambda: sign_raw(
        {"alg": "HS256", "kid": "k1"}, make_claims(), RSA1_PUBLIC_PEM.read_bytes()
    ),
    "unknown_kid": lambda: sign_rs256(make_claims(), kid="nope"),
    "tampered": lambda: _tamper(sign_rs256(make_claims())),
    "lifetime_too_long": lambda: sign_rs256(make_claims(ttl=7200)),
    "missing_tenant": lambda: sign_rs256(make_claims(tenant=None)),
    "missing_exp": lambda: sign_rs256(make_claims(exp=None)),
    "rsa_key_not_ours": lambda: sign_rs256(make_claims(), kid="k1", key="rsa2"),
    "hs256_wrong_secret": lambda: sign_raw(
        {"alg": "HS256"},
        make_claims(iss="https://dev.gateway.local"),
        b"x" * 40,
    ),
}


def _tamper(token: str) -> str:
    head, payload, sig = token.split(".")
    return ".".join([head, payload, sig[:-4] + ("AAAA" if sig[-4:] != "AAAA" else "BBBB")])


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_invalid_tokens_are_401(stack: Stack, case: str) -> None:
    token = BAD_TOKENS[case]()
    with pytest.raises(openai.AuthenticationError) as info:
        _sdk(stack, token).chat.completions.create(
            model="gemma-4-mm", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.status_code == 401
    assert info.value.code == "invalid_token"
    assert info.value.response.headers["www-authenticate"].startswith("Bearer")
    assert token not in info.value.response.text
    assert worker_posts(stack.sim) == []


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Basic dXNlcjpwYXNz"}, {"authorization": "Bearer"}],
    ids=["none", "basic", "empty"],
)
def test_missing_credentials(stack: Stack, headers: dict[str, str]) -> None:
    response = httpx.post(stack.url + "/v1/chat/completions", json=chat_body(), headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_credentials"
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_duplicate_authorization_headers_refused(stack: Stack) -> None:
    token = stack.rs256()
    response = httpx.post(
        stack.url + "/v1/chat/completions",
        json=chat_body(),
        headers=[("authorization", f"Bearer {token}"), ("authorization", f"Bearer {token}")],
    )
    assert response.status_code == 401


def test_forbidden_and_not_found(stack: Stack) -> None:
    unknown = _sdk(stack, stack.rs256(tenant="initech"))
    with pytest.raises(openai.PermissionDeniedError) as denied:
        unknown.models.list()
    assert denied.value.code == "tenant_not_configured"

    no_scope = _sdk(stack, sign_rs256(make_claims(scope="evidence")))
    with pytest.raises(openai.PermissionDeniedError) as scope:
        no_scope.chat.completions.create(
            model="gemma-4-mm", messages=[{"role": "user", "content": "x"}]
        )
    assert scope.value.code == "insufficient_scope"

    client = _sdk(stack, stack.rs256())
    for model in ("other-tenants-model", "default", SIM_ROUTE):
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        assert missing.value.code == "model_not_found"
    assert worker_posts(stack.sim) == []


def test_endpoint_not_allowed(tmp_path: Any) -> None:
    from tests.support.stack import running_stack

    with running_stack(tmp_path, acme={"endpoints": ["chat.completions"]}) as stack:
        with pytest.raises(openai.PermissionDeniedError) as info:
            _sdk(stack, stack.rs256()).completions.create(model="gemma-4-mm", prompt="x")
        assert info.value.code == "endpoint_not_allowed"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (chat_body(web_search_options={}), "unsupported_field"),
        (chat_body(max_tool_rounds=3), "unsupported_field"),
        (chat_body(session_id="s"), "unsupported_field"),
        (chat_body(surprise=1), "unsupported_field"),
        (chat_body(tools=[{"type": "web_search"}]), "unsupported_field"),
        (chat_body(max_tokens=100_000), "output_tokens_exceeded"),
        (chat_body("x" * 70_000), "prompt_too_large"),
    ],
)
def test_request_bounds(stack: Stack, body: dict[str, Any], code: str) -> None:
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert worker_posts(stack.sim) == []
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == "rejected" and receipt["error_code"] == code
    assert receipt["request_sha256"] is None


def test_invalid_json_and_depth(stack: Stack) -> None:
    with stack.client() as client:
        bad = client.post(
            "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
        )
        deep: Any = "x"
        for _ in range(40):
            deep = [deep]
        nested = client.post("/v1/chat/completions", json=chat_body(stop=deep))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert nested.status_code == 400 and nested.json()["error"]["code"] == "invalid_request"


def test_body_limit_content_length_and_chunked(tmp_path: Any) -> None:
    from tests.support.stack import running_stack

    with running_stack(tmp_path, acme={"limits": {"max_body_bytes": 2048}}) as stack:
        big = b'{"model":"gemma-4-mm","messages":[{"role":"user","content":"' + b"x" * 4096
        with stack.client() as client:
            declared = client.post(
                "/v1/chat/completions", content=big, headers={"content-type": "application/json"}
            )

            def chunks() -> Any:
                for _ in range(64):
                    yield b"x" * 1024

            chunked = client.post(
                "/v1/chat/completions",
                content=chunks(),
                headers={"content-type": "application/json"},
            )
        for response in (declared, chunked):
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "body_too_large"
        assert worker_posts(stack.sim) == []


def test_sdk_error_classes_for_limits(stack: Stack) -> None:
    client = _sdk(stack, stack.rs256())
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="gemma-4-mm", messages=[{"role": "user", "content": "x"}], max_tokens=99_999
        )
    assert info.value.code == "output_tokens_exceeded"


def test_admin_routes_unreachable(stack: Stack) -> None:
    with stack.client() as client:
        for method, path in [
            ("POST", "/v1/models/unload"),
            ("POST", "/v1/models/reload"),
            ("POST", "/re_isq"),
            ("GET", "/v1/system/info"),
            ("GET", "/ui/"),
            ("POST", "/v1/models/status"),
            ("POST", "/v1/load_lora_adapter"),
        ]:
            response = client.request(method, path, json={})
            # 405 where the path is a model alias's (GET /v1/models/{alias}).
            expected = {404: "not_found", 405: "method_not_allowed"}
            assert response.status_code in expected, path
            assert response.json()["error"]["code"] == expected[response.status_code]
        # The gateway's own approval route (spec §22) answers from its books: an id
        # it never made is 404, and the worker's approval route is never called.
        approval = client.post("/v1/agent/approvals/x", json={"decision": "approve"})
        assert (approval.status_code, approval.json()["error"]["code"]) == (
            404,
            "approval_not_found",
        )
        # The SDK's responses.cancel is answered by the gateway itself (400 for a
        # tenant with the responses endpoint, test_sdk_conformance; 403 here, where
        # the default policy lacks it), never by the worker's cancel route.
        cancel = client.post("/v1/responses/resp_1/cancel", json={})
        assert (cancel.status_code, cancel.json()["error"]["code"]) == (403, "endpoint_not_allowed")
    assert worker_posts(stack.sim) == []


def test_cors_exact_origin(tmp_path: Any) -> None:
    from tests.support.stack import running_stack

    with running_stack(tmp_path, cors={"allow_origins": ["https://app.example.com"]}) as stack:
        pre = {"access-control-request-method": "POST"}
        allowed = httpx.options(
            stack.url + "/v1/chat/completions",
            headers={"origin": "https://app.example.com", **pre},
        )
        refused = httpx.options(
            stack.url + "/v1/chat/completions",
            headers={"origin": "https://evil.example.com", **pre},
        )
        with stack.client() as client:
            simple = client.post(
                "/v1/chat/completions",
                json=chat_body(),
                headers={"origin": "https://evil.example.com"},
            )
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == "https://app.example.com"
    assert refused.status_code == 204
    assert not [h for h in refused.headers if h.startswith("access-control-")]
    assert not [h for h in simple.headers if h.startswith("access-control-")]


def test_inference_paths_other_methods_are_405(stack: Stack) -> None:
    # POSTs to inference paths skip the router; other methods still reach it.
    with stack.client() as client:
        for path in ("/v1/chat/completions", "/v1/completions"):
            response = client.get(path)
            assert response.status_code == 405, path
            assert response.json()["error"]["code"] == "method_not_allowed"
            assert response.headers["x-request-id"]
    assert worker_posts(stack.sim) == []


def test_unexpected_error_is_a_clean_500_and_releases_everything(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "prompt-text-that-must-not-leak"
    runtime = stack.runtime

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(secret)

    # Both ways in: the memory store judges at once (reserve_now), a shared one is awaited.
    originals = runtime.ratelimit.reserve, runtime.ratelimit.reserve_now
    runtime.ratelimit.reserve = runtime.ratelimit.reserve_now = broken
    try:
        with stack.client() as client:
            response = client.post(
                "/v1/chat/completions",
                json=chat_body(secret),
                headers={"x-request-id": "req-broken-1"},
            )
    finally:
        runtime.ratelimit.reserve, runtime.ratelimit.reserve_now = originals
    assert response.status_code == 500
    body = response.json()
    assert body["error"]["code"] == "internal_error"
    assert secret not in response.text
    assert response.headers["x-request-id"] == "req-broken-1"
    receipt = stack.receipt("req-broken-1")
    assert (receipt["outcome"], receipt["error_code"]) == ("incomplete", "internal_error")
    assert runtime.table.admissions.in_use == 0
    assert not runtime.inflight
    assert secret not in caplog.text
    assert "RuntimeError" in caplog.text
    # The gateway still serves.
    with stack.client() as client:
        assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
