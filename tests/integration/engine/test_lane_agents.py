"""Agents through the real gateway on the real engine's agentic loop (spec §22).

The session's tiny-model adapter runs the engine's own loop: a regex grammar
makes the random model call ``mistralrs_search_the_web``, the engine asks its
approval callback (the adapter turns that into the worker's approval event
and waits for the gateway's ``POST /v1/agent/approvals/{id}``), and on
approve runs its search callback (the adapter's local stub, never the
network). The worker's named events are the adapter's framing of what the
callbacks showed (``gateway/testing/engine/agents.py``); what each test
asserts of the **engine** comes from its callbacks (``/adapter/agent-runs``)
and its own session record (``/adapter/sessions/{id}``).

The run must end with a final chunk for the gateway to finish the stream
cleanly, and a model forced to call a tool calls one every round. So the
requests are sized against the model's 512-token context: the first round's
prompt plus the forced call fit, and the second round's prompt (the first
plus the tool's result) leaves less room than the call needs, so the engine
ends it with ``finish_reason: "length"`` and the partial call as content.
The round-cap test sizes it the other way: the model would call a third time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.engine import EngineAdapter, Stream, parse_sse
from tests.support.engine_stack import ALIAS, EngineStack, running_engine_stack

SESSION_ENV = "GW_TEST_ENGINE_AGENT_SESSION_KEY"
ALLOWED = "docs.example.com"
SEARCH = "mistralrs_search_the_web"
POLICY_ROUNDS = 2
#: the filler word is one token of the model's vocabulary (a corpus syllable)
FILLER = "ka "


@pytest.fixture(scope="module")
def agents(
    tiny_adapter: EngineAdapter, dev_secret: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineStack]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SESSION_ENV, "s" * 40)
        with running_engine_stack(
            tmp_path_factory.mktemp("lane-agents"),
            tiny_adapter,
            policy={
                "agents": {
                    "tools": ["web_search"],
                    # one domain: the search stub answers one result per allowed domain
                    "web": {"allowed_domains": [ALLOWED]},
                    "max_tool_rounds": POLICY_ROUNDS,
                    "reserve_tokens_per_round": 256,
                }
            },
            upstream={"agents": {"web_search": True, "max_tool_rounds": 16}},
            agents={"session_key_env": SESSION_ENV},
        ) as stack:
            yield stack


def _forced(query: str) -> dict[str, str]:
    """A regex grammar: the model's whole answer is this one search call."""
    call = json.dumps({"name": SEARCH, "arguments": {"query": query}})
    return {"type": "regex", "value": re.escape(call)}


def _body(query: str, filler_words: int, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": FILLER * filler_words}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": 400,
        "grammar": _forced(query),
        "web_search_options": {},
    }
    body.update(extra)
    return body


def _stream(stack: EngineStack, body: dict[str, Any], **headers: str) -> tuple[str, Stream]:
    with (
        stack.client(timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        raw = b"".join(response.iter_raw())
        return response.headers["x-request-id"], parse_sse(raw)


def _run(adapter: EngineAdapter, session: str) -> dict[str, Any]:
    """The adapter's record of the engine's run in ``session`` (the worker's id)."""
    runs = httpx.get(adapter.base_url + "/adapter/agent-runs", timeout=10).json()["runs"]
    found = [r for r in runs if r["engine_session_id"] == session]
    assert len(found) == 1, (session, [r["engine_session_id"] for r in runs])
    run: dict[str, Any] = found[0]
    return run


def _engine_tool_messages(adapter: EngineAdapter, session: str) -> list[str]:
    """The tool results in the engine's own session record (what its model was given)."""
    answer = httpx.get(adapter.base_url + f"/adapter/sessions/{session}", timeout=10)
    assert answer.status_code == 200, session
    messages = answer.json()["messages"]
    return [m["content"]["Left"] for m in messages if m["role"] == {"Left": "tool"}]


def test_an_approved_search_runs_the_engines_search_callback(
    agents: EngineStack, tiny_adapter: EngineAdapter
) -> None:
    query = "x" * 80
    request_id, stream = _stream(
        agents, _body(query, 287, session_id="approved-1"), **{"x-agent-events": "1"}
    )
    assert stream.events[-1] == "[DONE]"
    # The caller sees the gateway's own frames for the round, never the worker's events.
    names = [e.name for e in stream.named]
    assert names == ["agent.tool_call", "agent.tool_call"]
    calling, complete = (e.data for e in stream.named)
    assert calling == {"round": 0, "tool": SEARCH, "phase": "calling"}
    assert complete == {
        "round": 0,
        "tool": SEARCH,
        "phase": "complete",
        "decision": "approve",
        "sources": [ALLOWED],
    }
    assert b"appr_" not in stream.raw and b"agentic_tool" not in stream.raw
    # The engine's second generation ran out of context inside the forced call.
    final = stream.chunks[-1]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["session_id"] == "approved-1"  # the caller's own id back
    assert stream.text().startswith('{"name": "' + SEARCH)

    receipt = agents.receipt(request_id)
    agent = receipt["agent"]
    (call,) = agent["calls"]
    assert (call["decision"], call["by"], call["kind"], call["tool"]) == (
        "approve", "policy", "web_search", SEARCH,
    )  # fmt: skip
    assert agent["rounds"] == 1 and agent["session"].startswith("gs_")
    # What the engine did: it asked once, the gateway approved, its search callback ran.
    run = _run(tiny_adapter, agent["session"])
    assert run["permission"] == "ask" and run["max_tool_rounds"] == POLICY_ROUNDS
    assert run["outcome"] == "finished"
    (engine_round,) = run["rounds"]
    assert engine_round["decision"] == "approve" and engine_round["by"] == "caller"
    assert engine_round["searched"] is True and engine_round["query"] == query
    assert engine_round["sources"] == [ALLOWED]
    # The stub's result is in the engine's own record, as the tool result its model read.
    (tool_result,) = _engine_tool_messages(tiny_adapter, agent["session"])
    assert json.loads(tool_result)["sources"] == [ALLOWED]
    # Usage: the engine's, summed over both generations (two prompts of one context each).
    (usage,) = [c["usage"] for c in stream.chunks if c.get("usage")]
    assert receipt["usage"]["source"] == "reported"
    assert receipt["usage"]["completion_tokens"] == usage["completion_tokens"]
    assert usage["prompt_tokens"] > 512


def test_a_denied_fetch_never_reaches_the_engines_search(
    agents: EngineStack, tiny_adapter: EngineAdapter
) -> None:
    # A search query that is a URL is a fetch: the gateway checks its host first.
    query = "http://169.254.169.254/latest/meta-data/" + "x" * 60
    request_id, stream = _stream(agents, _body(query, 287))
    assert stream.events[-1] == "[DONE]"
    assert stream.chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert stream.named == []  # no x-agent-events: content only
    agent = agents.receipt(request_id)["agent"]
    (call,) = agent["calls"]
    decided = (call["decision"], call["reason"], call["by"])
    assert decided == ("deny", "address_not_public", "policy")
    run = _run(tiny_adapter, agent["session"])
    (engine_round,) = run["rounds"]
    # The engine saw the denial: its search callback never ran.
    assert engine_round["decision"] == "deny" and engine_round["searched"] is False
    assert "address_not_public" in engine_round["message"]
    (tool_result,) = _engine_tool_messages(tiny_adapter, agent["session"])
    assert json.loads(tool_result) == {"status": "denied", "exception": engine_round["message"]}


def test_max_tool_rounds_is_clamped_and_bounds_the_engines_rounds(
    agents: EngineStack, tiny_adapter: EngineAdapter
) -> None:
    """The caller asks for 50 rounds, the policy allows 2: the engine gets 2 and
    runs 2, though its model calls a third time (its context has room). At the
    cap the engine ends the run without a final chunk (nor ``[DONE]``); the
    caller, who saw the two rounds, is told the worker closed early."""
    body = _body("x" * 8, 10, max_tool_rounds=50)
    request_id, stream = _stream(agents, body, **{"x-agent-events": "1"})
    phases = [(e.data["round"], e.data["phase"]) for e in stream.named]
    assert phases == [(0, "calling"), (0, "complete"), (1, "calling"), (1, "complete")]
    assert stream.events[-1] != "[DONE]" and "[DONE]" not in stream.events
    receipt = agents.receipt(request_id)
    assert stream.chunks[-1]["error"]["code"] == receipt["error_code"] == "upstream_unavailable"
    agent = receipt["agent"]
    assert agent["rounds"] == POLICY_ROUNDS
    assert [c["decision"] for c in agent["calls"]] == ["approve"] * POLICY_ROUNDS
    run = _run(tiny_adapter, agent["session"])
    assert run["max_tool_rounds"] == POLICY_ROUNDS  # what the engine was given
    assert [r["round"] for r in run["rounds"]] == [0, 1]
    assert all(r["searched"] for r in run["rounds"])
    # The engine closed its stream at the cap (the SDK's "Received none").
    assert run["outcome"] == "unfinished"
    assert len(_engine_tool_messages(tiny_adapter, agent["session"])) == POLICY_ROUNDS


def test_the_workers_session_is_namespaced_per_tenant(
    agents: EngineStack, tiny_adapter: EngineAdapter
) -> None:
    """Two tenants send the same session id and the same message: the engine
    runs two sessions of the gateway's naming, neither the caller's id; each
    caller gets its own id back."""
    body = _body("x" * 80, 287, session_id="shared-123", stream=False)
    sessions = {}
    for tenant in ("acme", "globex"):
        with agents.client(agents.rs256(tenant), timeout=120) as client:
            response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["session_id"] == "shared-123"
        assert answer["agent"]["tool_calls"] == [
            {"round": 0, "tool": SEARCH, "kind": "web_search", "decision": "approve"}
        ]
        receipt = agents.receipt(response.headers["x-request-id"])
        sessions[tenant] = receipt["agent"]["session"]
        run = _run(tiny_adapter, sessions[tenant])
        assert run["requested_session_id"] == sessions[tenant]  # what the engine got
    assert sessions["acme"] != sessions["globex"]
    assert all(re.fullmatch(r"gs_[0-9a-f]{32}", s) for s in sessions.values())
    listed = httpx.get(tiny_adapter.base_url + "/adapter/sessions/shared-123", timeout=10)
    assert listed.status_code == 404  # the engine never had the caller's id
    for session in sessions.values():
        assert len(_engine_tool_messages(tiny_adapter, session)) == 1
