"""Agents under the gateway's authority (spec §22): the real gateway in front of
the simulator's agentic chat (its tool loop, approvals and sessions byte for
byte), every tool call approved or denied by the gateway, per tenant."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.poll import eventually
from tests.support.stack import Stack, running_stack, sse_data

SESSION_ENV = "GW_TEST_AGENT_SESSION_KEY"
SESSION_KEY = "k" * 40
ALLOWED = "docs.example.com"
#: a public address (TEST-NET is reserved: use one that is routable and public)
PUBLIC = "93.184.216.34"
CODE_TOOL = {"type": "code_interpreter", "container": {"type": "auto"}}
ENDPOINTS = ["chat.completions", "responses", "messages", "models", "evidence"]
ROUTE_AGENTS = {"web_search": True, "python": True, "max_tool_rounds": 16}


def _policy(**agents: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "tools": ["web_search", "python"],
        "web": {"allowed_domains": [ALLOWED, "*.wikipedia.org"]},
        "max_tool_rounds": 8,
        "reserve_tokens_per_round": 64,
    }
    settings.update(agents)
    return {"agents": settings}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SESSION_ENV, SESSION_KEY)
        patch.setenv(DEMO_SECRET_ENV, HS_SECRET)
        with running_stack(
            tmp_path_factory.mktemp("agents"),
            acme={**_policy(), "endpoints": ENDPOINTS},
            globex=_policy(),
            upstream={"agents": ROUTE_AGENTS},
            agents={
                "session_key_env": SESSION_ENV,
                "hosts": {
                    ALLOWED: [PUBLIC],
                    "en.wikipedia.org": [PUBLIC],
                    "inside.wikipedia.org": ["127.0.0.1"],
                    "meta.wikipedia.org": ["169.254.169.254"],
                    "mixed.wikipedia.org": [PUBLIC, "10.1.2.3"],
                },
            },
        ) as built:
            yield built


def _body(directive: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gemma-4-mm",
        "messages": [{"role": "user", "content": f"look it up [[sim {directive}]]"}],
        "stream": stream,
        "web_search_options": {},
    }
    body.update(extra)
    return body


def _post(stack: Stack, body: dict[str, Any], **headers: str) -> httpx.Response:
    with stack.client(timeout=30) as client:
        return client.post("/v1/chat/completions", json=body, headers=headers)


def _chat_sent(stack: Stack) -> dict[str, Any]:
    """The last chat request the worker received (approvals are posted after it)."""
    chats = [r for r in stack.sim.requests() if r.path == "/v1/chat/completions"]
    body = chats[-1].json
    assert isinstance(body, dict)
    return body


def _last_run(stack: Stack) -> Any:
    runs = stack.sim.agent_runs()
    assert runs, "the worker ran no agentic request"
    return runs[-1]


def _decisions(stack: Stack, run: Any) -> list[str]:
    ids = set(run.approvals)
    return [d.decision for d in stack.sim.approval_decisions() if d.approval_id in ids]


def test_an_allowed_domain_is_approved_and_the_stream_completes(stack: Stack) -> None:
    response = _post(stack, _body(f"agent=url:https://{ALLOWED}/guide"))
    assert response.status_code == 200
    text = response.text
    assert text.rstrip().endswith("data: [DONE]")
    # The worker's agentic events are the gateway's: never relayed as they came.
    assert "agentic_tool" not in text and "appr_" not in text
    run = _last_run(stack)
    assert _decisions(stack, run) == ["approve"]
    assert [r.outcome for r in run.rounds] == ["approved"]
    # What the worker was sent: ask, a stream, the clamped rounds, the policy's domains.
    sent = _chat_sent(stack)
    assert sent["agent_permission"] == "ask" and sent["stream"] is True
    assert sent["max_tool_rounds"] == 8
    assert ALLOWED in sent["web_search_options"]["filters"]["allowed_domains"]
    receipt = stack.receipt(response.headers["x-request-id"])
    (call,) = receipt["agent"]["calls"]
    assert (call["decision"], call["by"], call["kind"], call["reason"]) == (
        "approve",
        "policy",
        "web_search",
        None,
    )
    assert receipt["agent"]["rounds"] == 1 and receipt["outcome"] == "complete"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1/admin", "address_not_public"),
        ("http://2130706433/", "address_not_public"),
        ("http://0x7f.1/", "address_not_public"),
        ("http://[::1]/", "address_not_public"),
        ("http://169.254.169.254/latest/meta-data/", "address_not_public"),
        ("http://localhost/", "domain_not_allowed"),
        ("https://inside.wikipedia.org/", "address_not_public"),
        ("https://meta.wikipedia.org/", "address_not_public"),
        ("https://mixed.wikipedia.org/", "address_not_public"),
        (f"https://{ALLOWED}@evil.example.net/", "domain_not_allowed"),
        (f"https://{ALLOWED}.evil.example.net/", "domain_not_allowed"),
        (f"https://{ALLOWED}/go?url=http://169.254.169.254/", "address_not_public"),
        (f"https://{ALLOWED}/go?next=https://evil.example.net/", "domain_not_allowed"),
        ("https://nowhere.wikipedia.org/", "unresolvable"),
    ],
    ids=[
        "ip-literal",
        "decimal-ip",
        "hex-ip",
        "ipv6-loopback",
        "metadata",
        "localhost",
        "name-to-loopback",
        "name-to-metadata",
        "name-to-mixed",
        "userinfo",
        "suffix-trick",
        "redirect-to-metadata",
        "redirect-elsewhere",
        "unresolvable",
    ],
)
def test_ssrf_attempts_are_denied_and_the_model_is_told_why(
    stack: Stack, url: str, reason: str
) -> None:
    # The directive's own syntax: brackets and commas percent-encoded (the simulator decodes).
    quoted = url.replace(",", "%2C").replace("[", "%5B").replace("]", "%5D")
    response = _post(stack, _body(f"agent=url:{quoted}"))
    assert response.status_code == 200
    assert response.text.rstrip().endswith("data: [DONE]")
    run = _last_run(stack)
    assert _decisions(stack, run) == ["deny"]
    (decided,) = [d for d in stack.sim.approval_decisions() if d.approval_id in run.approvals]
    assert decided.message is not None and reason in decided.message
    assert not decided.remember_for_session
    assert [r.outcome for r in run.rounds] == ["denied"]
    receipt = stack.receipt(response.headers["x-request-id"])
    (call,) = receipt["agent"]["calls"]
    assert (call["decision"], call["reason"], call["by"]) == ("deny", reason, "policy")


def test_a_plain_search_query_needs_no_resolution(stack: Stack) -> None:
    response = _post(stack, _body("agent=web:rust%20async%20runtimes"))
    assert response.status_code == 200
    assert _decisions(stack, _last_run(stack)) == ["approve"]


def test_python_runs_only_for_a_tenant_whose_policy_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _dev_secret: None
) -> None:
    monkeypatch.setenv(SESSION_ENV, SESSION_KEY)
    web_only = _policy(tools=["web_search"])
    with running_stack(
        tmp_path,
        acme=web_only,
        upstream={"agents": ROUTE_AGENTS},
        agents={"session_key_env": SESSION_ENV},
    ) as only_web:
        body = _body("agent=python", tools=[CODE_TOOL])
        response = _post(only_web, body)
        assert response.status_code == 403
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("tool_not_allowed", "tools[0]")
        assert only_web.sim.agent_runs() == []


def test_a_tenant_without_agents_is_refused_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _dev_secret: None
) -> None:
    monkeypatch.setenv(SESSION_ENV, SESSION_KEY)
    with running_stack(
        tmp_path, upstream={"agents": ROUTE_AGENTS}, agents={"session_key_env": SESSION_ENV}
    ) as plain:
        response = _post(plain, _body("agent=web"))
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_field", "web_search_options")


def test_a_non_streaming_caller_gets_the_assembled_answer_with_its_agent(stack: Stack) -> None:
    response = _post(stack, _body(f"agent=url:https://{ALLOWED}/a", stream=False))
    assert response.status_code == 200
    answer = response.json()
    assert answer["choices"][0]["message"]["content"]
    agent = answer["agent"]
    assert agent["rounds"] == 1
    assert agent["tool_calls"] == [
        {
            "round": 0,
            "tool": "mistralrs_website_content_extractor",
            "kind": "web_search",
            "decision": "approve",
        }
    ]
    # The worker was still asked for a stream (ask needs one).
    assert _chat_sent(stack)["stream"] is True
    assert "session_id" not in answer  # the caller sent none


def test_agent_events_are_shown_to_a_caller_that_asks(stack: Stack) -> None:
    response = _post(
        stack,
        _body(f"agent=url:https://{ALLOWED}/a,url:http://10.0.0.1/"),
        **{"x-agent-events": "1"},
    )
    assert response.status_code == 200
    frames = response.text.split("\n\n")
    calls = [f for f in frames if f.startswith("event: agent.tool_call")]
    assert len(calls) == 4  # calling and complete, two rounds
    assert '"decision":"approve"' in calls[1] and '"decision":"deny"' in calls[3]
    assert all("appr_" not in f for f in frames)


def test_sessions_are_namespaced_per_tenant(stack: Stack) -> None:
    """Two tenants with the same caller session_id and the same messages never
    share a worker session; each caller sees its own id back."""
    seen = {}
    for tenant in ("acme", "globex"):
        body = _body(f"agent=url:https://{ALLOWED}/a", stream=False, session_id="shared-123")
        with stack.client(stack.rs256(tenant), timeout=30) as client:
            response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["session_id"] == "shared-123"
        seen[tenant] = _last_run(stack).session_id
    assert seen["acme"] != seen["globex"]
    assert all(s.startswith("gs_") and len(s) == 35 for s in seen.values())
    assert "shared-123" not in {r.session_id for r in stack.sim.agent_runs()}


def test_a_streaming_caller_sees_its_own_session_id_never_the_workers(stack: Stack) -> None:
    body = _body(f"agent=url:https://{ALLOWED}/a", session_id="shared-123")
    with stack.client(stack.rs256("acme"), timeout=30) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    chunks = [
        json.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]
    assert [c["session_id"] for c in chunks if "session_id" in c] == ["shared-123"]
    worker_session = _last_run(stack).session_id
    assert worker_session.startswith("gs_") and worker_session not in response.text


@pytest.mark.parametrize(
    "fault",
    [
        "unknown_event",
        "complete_without_calling",
        "round_regress",
        "two_approvals",
        "content_in_round",
        "end_in_round",
        "done_in_round",
        "ran_after_deny",
        "file_outside_round",
        "approval_outside_round",
    ],
)
def test_every_agentic_protocol_violation_ends_the_stream_with_one_error(
    stack: Stack, fault: str
) -> None:
    plan = "url:http://10.0.0.1/" if fault == "ran_after_deny" else f"url:https://{ALLOWED}/a"
    if fault == "round_regress":
        plan += f",url:https://{ALLOWED}/b"
    files = " files=1" if fault == "file_outside_round" else ""
    response = _post(stack, _body(f"agent={plan} agent_fault={fault}{files}"))
    if response.status_code == 502:
        # Broken before any event reached the caller: an ordinary error (spec §8).
        assert response.json()["error"]["code"] == "upstream_protocol_error"
        return
    assert response.status_code == 200
    data = sse_data(response.text)
    assert data[-1] != "[DONE]", fault
    assert "upstream_protocol_error" in data[-1], (fault, data[-1])


def test_max_run_s_ends_the_run_with_agent_run_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _dev_secret: None
) -> None:
    monkeypatch.setenv(SESSION_ENV, SESSION_KEY)
    with running_stack(
        tmp_path,
        acme=_policy(max_run_s=1),
        upstream={"agents": ROUTE_AGENTS},
        agents={"session_key_env": SESSION_ENV, "hosts": {ALLOWED: [PUBLIC]}},
    ) as slow:
        body = _body(f"agent=url:https://{ALLOWED}/a chunks=40 delay_ms=100")
        response = _post(slow, body)
        assert response.status_code == 200
        data = sse_data(response.text)
        assert data[-1] != "[DONE]" and "agent_run_timeout" in data[-1]
        receipt = slow.receipt(response.headers["x-request-id"])
        # Spec §24: the receipt outcome of a run past max_run_s is upstream_timeout.
        assert (receipt["error_code"], receipt["outcome"]) == (
            "agent_run_timeout",
            "upstream_timeout",
        )


def test_the_reservation_counts_every_round(stack: Stack) -> None:
    response = _post(stack, _body(f"agent=url:https://{ALLOWED}/a", stream=False))
    assert response.status_code == 200
    receipt = stack.receipt(response.headers["x-request-id"])
    sha = hashlib.sha256
    assert receipt["agent"]["calls"][0]["arguments_sha256"] != sha(b"").hexdigest()
    assert eventually(lambda: stack.metric("gateway_agent_tool_calls_total", tenant="acme") > 0)


def test_responses_agentic_tools_stay_refused(stack: Stack) -> None:
    body = {"model": "gemma-4-mm", "input": "hi", "tools": [{"type": "web_search"}]}
    with stack.client(timeout=10) as client:
        response = client.post("/v1/responses", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_field"


def _anthropic(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=stack.rs256(), max_retries=0, timeout=30)


def test_a_messages_web_search_tool_runs_under_the_same_authority(stack: Stack) -> None:
    client = _anthropic(stack)
    try:
        message = client.messages.create(
            model="gemma-4-mm",
            max_tokens=64,
            tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
            messages=[{"role": "user", "content": f"read [[sim agent=url:https://{ALLOWED}/m]]"}],
        )
    finally:
        client.close()
    assert message.content and message.content[0].type == "text"
    run = _last_run(stack)
    assert _decisions(stack, run) == ["approve"]
    sent = _chat_sent(stack)
    # Forwarded as the worker's chat fields; max_uses lowers the rounds.
    assert sent["max_tool_rounds"] == 2 and sent["agent_permission"] == "ask"
    assert "tools" not in sent or all(t.get("type") != "web_search_20250305" for t in sent["tools"])


def test_a_streamed_messages_run_denies_a_private_fetch(stack: Stack) -> None:
    client = _anthropic(stack)
    try:
        with client.messages.stream(
            model="gemma-4-mm",
            max_tokens=64,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            messages=[{"role": "user", "content": "read [[sim agent=url:http://10.9.8.7/]]"}],
        ) as stream:
            final = stream.get_final_message()
    finally:
        client.close()
    assert final.stop_reason is not None
    assert _decisions(stack, _last_run(stack)) == ["deny"]
