"""Files and caller approvals end to end (spec §22): the real gateway in front of
the simulator's agentic chat. A stream sent with ``x-agent-events: 1`` asks its
caller (``event: agent.approval_required``), the caller decides through
``POST /v1/agent/approvals/{id}``, and the run goes on at once; a file a tool
produced is kept as the tenant's and served by ``/v1/files/{id}/content``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack

SESSION_ENV = "GW_TEST_AGENT_SESSION_KEY"
ALLOWED = "docs.example.com"
PUBLIC = "93.184.216.34"
CODE_TOOL = {"type": "code_interpreter", "container": {"type": "auto"}}
ENDPOINTS = ["chat.completions", "models", "files"]


def _agents(approval: str) -> dict[str, Any]:
    return {
        "endpoints": ENDPOINTS,
        "agents": {
            "tools": ["web_search", "python"],
            "web": {"allowed_domains": [ALLOWED]},
            "approval": approval,
            "approval_timeout_s": 5,
            "max_tool_rounds": 4,
            "reserve_tokens_per_round": 64,
        },
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SESSION_ENV, "k" * 40)
        patch.setenv(DEMO_SECRET_ENV, HS_SECRET)
        with running_stack(
            tmp_path_factory.mktemp("agents-caller"),
            acme=_agents("caller"),
            globex=_agents("gateway"),
            upstream={"agents": {"web_search": True, "python": True, "max_tool_rounds": 8}},
            agents={"session_key_env": SESSION_ENV, "hosts": {ALLOWED: [PUBLIC]}},
        ) as built:
            yield built


def _body(directive: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gemma-4-mm",
        "messages": [{"role": "user", "content": f"work [[sim {directive}]]"}],
        "stream": True,
    }
    body.update(extra)
    return body


def _events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event name, data) of an SSE stream, as they arrive; bounded by the stream."""
    name = "message"
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, line[6:]
            name = "message"


def _decide(stack: Stack, approval_id: str, decision: str, tenant: str = "acme") -> httpx.Response:
    with stack.client(stack.rs256(tenant=tenant)) as c:
        return c.post(f"/v1/agent/approvals/{approval_id}", json={"decision": decision})


def _run_asking(stack: Stack, decision: str) -> tuple[list[tuple[str, str]], float, str]:
    """One stream that asks: the events, the seconds from the decision to the
    next event, and the approval id."""
    seen: list[tuple[str, str]] = []
    approval_id, waited = "", 0.0
    body = _body(f"agent=url:https://{ALLOWED}/guide", web_search_options={})
    with (
        stack.client(timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body, headers={"x-agent-events": "1"}) as r,
    ):
        assert r.status_code == 200
        events = _events(r.iter_lines())
        for name, data in events:
            seen.append((name, data))
            if name == "agent.approval_required":
                asked = json.loads(data)
                approval_id = asked["approval_id"]
                assert asked["tool"]["kind"] == "web_search"
                # Another tenant cannot answer it, even knowing the id.
                foreign = _decide(stack, approval_id, "approve", tenant="globex")
                assert foreign.status_code == 404
                began = time.monotonic()
                answer = _decide(stack, approval_id, decision)
                assert (answer.status_code, answer.json()) == (200, {"status": "resolved"})
                name, data = next(events)
                waited = time.monotonic() - began
                seen.append((name, data))
        assert seen[-1] == ("message", "[DONE]")
    return seen, waited, approval_id


def test_the_caller_approves_through_the_route_and_the_run_goes_on_at_once(stack: Stack) -> None:
    seen, waited, approval_id = _run_asking(stack, "approve")
    assert approval_id.startswith("apr_") and len(approval_id) == 36
    assert waited < 1.0, waited
    calls = [json.loads(d) for n, d in seen if n == "agent.tool_call"]
    assert [c.get("decision") for c in calls if c["phase"] == "complete"] == ["approve"]
    decided = [d for d in stack.sim.approval_decisions() if d.decision == "approve"]
    assert decided, "the worker was told the caller's decision"
    # The approval is over: a late decision finds nothing.
    assert _decide(stack, approval_id, "deny").status_code == 404


def test_the_caller_denies_and_the_worker_is_told_so(stack: Stack) -> None:
    seen, _, approval_id = _run_asking(stack, "deny")
    calls = [json.loads(d) for n, d in seen if n == "agent.tool_call"]
    assert [c.get("decision") for c in calls if c["phase"] == "complete"] == ["deny"]
    assert _decide(stack, approval_id, "approve").status_code == 404


def test_a_produced_file_is_served_to_its_tenant_only(stack: Stack) -> None:
    body = _body("agent=python files=1 file_mime=text/html file_bytes=300", tools=[CODE_TOOL])
    # globex's policy decides alone: no question, the file is its own.
    with stack.client(stack.rs256(tenant="globex"), timeout=30) as c:
        response = c.post("/v1/chat/completions", json=body, headers={"x-agent-events": "1"})
    assert response.status_code == 200
    shown = [
        json.loads(d) for n, d in _events(iter(response.text.splitlines())) if n == "agent.file"
    ]
    assert len(shown) == 1
    (file,) = shown
    # The worker said text/html; the bytes are text, and text they are served as.
    assert file["mime_type"] == "text/plain" and file["bytes"] == 300
    with stack.client(stack.rs256(tenant="globex")) as c:
        content = c.get(f"/v1/files/{file['id']}/content")
        record = c.get(f"/v1/files/{file['id']}").json()
    assert content.status_code == 200 and len(content.content) == 300
    assert content.headers["content-disposition"].startswith("attachment;")
    assert record["sha256"] == file["sha256"] and record["filename"] == file["name"]
    with stack.client(stack.rs256(tenant="acme")) as c:
        assert c.get(f"/v1/files/{file['id']}/content").status_code == 404
        assert c.delete(f"/v1/files/{file['id']}").status_code == 404


def test_a_caller_that_never_decides_is_denied_at_its_timeout(stack: Stack) -> None:
    body = _body(f"agent=url:https://{ALLOWED}/slow", web_search_options={})
    with (
        stack.client(timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body, headers={"x-agent-events": "1"}) as r,
    ):
        request_id = r.headers["x-request-id"]
        seen = list(_events(r.iter_lines()))
    assert any(name == "agent.approval_required" for name, _ in seen)
    assert seen[-1] == ("message", "[DONE]")
    (call,) = stack.receipt(request_id)["agent"]["calls"]
    assert (call["decision"], call["by"], call["reason"]) == ("deny", "timeout", "approval_timeout")
    assert stack.sim.approval_decisions()[-1].decision == "deny"


def test_a_caller_gone_while_asked_denies_before_the_worker_is_let_go(stack: Stack) -> None:
    """Spec §22: when the caller goes away every pending approval is denied at
    once, then the worker connection is closed."""
    before = len(stack.sim.approval_decisions())
    body = _body(f"agent=url:https://{ALLOWED}/gone", web_search_options={})
    with (
        stack.client(timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body, headers={"x-agent-events": "1"}) as r,
    ):
        request_id = r.headers["x-request-id"]
        for name, _ in _events(r.iter_lines()):
            if name == "agent.approval_required":
                break  # and hang up with the question open
    receipt = stack.receipt(request_id, timeout_s=10)
    (call,) = receipt["agent"]["calls"]
    assert (call["decision"], call["by"]) == ("deny", "cancel")
    assert receipt["outcome"] == "canceled"
    decided = stack.sim.approval_decisions()[before:]
    assert [d.decision for d in decided] == ["deny"]
    run = stack.sim.agent_runs()[-1]
    # The worker heard the denial while the stream was still open to it.
    assert run.abandoned_approval is None


def test_a_caller_approval_needs_a_stream_with_events(stack: Stack) -> None:
    body = _body(f"agent=url:https://{ALLOWED}/a", web_search_options={})
    with stack.client(timeout=30) as c:
        plain = c.post("/v1/chat/completions", json=body)
        unstreamed = c.post(
            "/v1/chat/completions", json={**body, "stream": False}, headers={"x-agent-events": "1"}
        )
    for response in (plain, unstreamed):
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "approval_requires_events"
