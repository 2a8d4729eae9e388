"""The engine's agentic loop behind the adapter, straight to it (``agents.py``).

Each request forces one call of a tool with a regex grammar and caps the
engine at one round, so the engine runs: the call, the approval callback (the
adapter's events and its wait for ``POST /v1/agent/approvals/{id}``), the
search callback on approval, then a second generation that calls again at
the cap, where the engine closes its stream without a final chunk. What the
engine did is read from ``/adapter/agent-runs`` (its callbacks) and
``/adapter/sessions/{id}`` (its own session record); the named events are
the adapter's framing, checked here byte for byte against the worker's
shapes (``mistralrs-agents-media.md`` §3.4).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.testing.engine.agents import EXTRACT_REFUSED, STUB_DOMAIN, TIMED_OUT
from tests.support.engine import EngineAdapter, Named, agentic_stream, running_adapter

SEARCH = "mistralrs_search_the_web"
EXTRACT = "mistralrs_website_content_extractor"
APPROVE = {"decision": "approve"}


def _body(session: str, tool: str = SEARCH, **extra: Any) -> dict[str, Any]:
    arguments = {"url": "http://127.0.0.1:9/"} if tool == EXTRACT else {"query": "x" * 8}
    call = json.dumps({"name": tool, "arguments": arguments})
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "ka ri to"}],
        "temperature": 0,
        "max_tokens": 100,
        "grammar": {"type": "regex", "value": re.escape(call)},
        "web_search_options": {},
        "agent_permission": "ask",
        "max_tool_rounds": 1,
        "session_id": session,
    }
    body.update(extra)
    return body


def _run(adapter: EngineAdapter, session: str) -> dict[str, Any]:
    runs = httpx.get(adapter.base_url + "/adapter/agent-runs", timeout=10).json()["runs"]
    (run,) = [r for r in runs if r["requested_session_id"] == session]
    found: dict[str, Any] = run
    return found


def _tool_results(adapter: EngineAdapter, session: str) -> list[str]:
    answer = httpx.get(adapter.base_url + f"/adapter/sessions/{session}", timeout=10)
    assert answer.status_code == 200
    messages = answer.json()["messages"]
    return [m["content"]["Left"] for m in messages if m["role"] == {"Left": "tool"}]


def _progress(round_: int, tool: str, phase: str, data: dict[str, Any]) -> bytes:
    """The server's ``serialize_agentic_progress`` text (its key order, compact)."""
    obj = {"type": "agentic_tool_call_progress", "round": round_, "tool_name": tool}
    obj.update(phase=phase, data=data)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _denied(message: str) -> dict[str, Any]:
    content = json.dumps({"status": "denied", "exception": message}, separators=(",", ":"))
    return {"tool_type": "custom", "content": content}


def test_an_approved_search_is_framed_as_the_worker_frames_it(tiny: EngineAdapter) -> None:
    before = tiny.stats()
    stream, posted = agentic_stream(tiny.base_url, _body("direct-approve"), lambda _: APPROVE)
    calling, approval, complete = stream.named
    assert [calling.name, approval.name, complete.name] == [
        "agentic_tool_call_progress", "agentic_tool_approval_required",
        "agentic_tool_call_progress",
    ]  # fmt: skip
    query = "x" * 8
    assert calling.raw == _progress(
        0, SEARCH, "calling", {"tool_type": "web_search", "query": query}
    )
    approval_id = approval.data["approval_id"]
    assert re.fullmatch(r"appr_[0-9a-f]{32}", approval_id)
    assert approval.raw == (
        b'{"type":"agentic_tool_approval_required","approval_id":"' + approval_id.encode()
        + b'","session_id":"direct-approve","round":0,"tool":{"source":"built_in",'
        b'"kind":"web_search","label":"Web search"},"arguments":{"query":"' + query.encode()
        + b'"}}'
    )  # fmt: skip
    assert complete.raw == _progress(
        0, SEARCH, "complete",
        {"tool_type": "web_search", "results_count": 1, "sources": [STUB_DOMAIN]},
    )  # fmt: skip
    assert posted == [(200, {"status": "resolved"})]
    # The engine called again at its cap of one round: it closed the stream with
    # no final chunk, so the body just ends (no chunk, no [DONE]), as the server's does.
    assert stream.chunks == [] and "[DONE]" not in stream.events
    assert tiny.stats()["streams_unfinished"] == before["streams_unfinished"] + 1
    run = _run(tiny, "direct-approve")
    assert run["outcome"] == "unfinished" and run["engine_session_id"] == "direct-approve"
    (engine_round,) = run["rounds"]
    assert engine_round["approval_id"] == approval_id and engine_round["searched"] is True
    (result,) = _tool_results(tiny, "direct-approve")
    assert json.loads(result)["output"][0]["url"] == f"https://{STUB_DOMAIN}/0"
    # The decision was taken: the id is gone from the route.
    again = httpx.post(
        tiny.base_url + f"/v1/agent/approvals/{approval_id}", json=APPROVE, timeout=10
    )
    assert (again.status_code, again.json()) == (404, {"status": "not_found"})


@pytest.mark.parametrize(
    ("decision", "message"),
    [
        ({"decision": "deny", "message": "not today"}, "not today"),
        ({"decision": "deny"}, "Agent action was denied."),
    ],
)
def test_a_denial_reaches_the_engine_and_its_search_never_runs(
    tiny: EngineAdapter, decision: dict[str, Any], message: str
) -> None:
    session = f"direct-deny-{len(decision)}"
    stream, posted = agentic_stream(tiny.base_url, _body(session), lambda _: decision)
    assert posted == [(200, {"status": "resolved"})]
    complete = stream.named[-1]
    assert complete.raw == _progress(0, SEARCH, "complete", _denied(message))
    (engine_round,) = _run(tiny, session)["rounds"]
    assert engine_round["searched"] is False and engine_round["decision"] == "deny"
    (result,) = _tool_results(tiny, session)
    assert json.loads(result) == {"status": "denied", "exception": message}


def test_the_page_extractor_never_runs_even_when_approved(tiny: EngineAdapter) -> None:
    """It always fetches its URL: the adapter turns an approval into a denial."""
    stream, _ = agentic_stream(tiny.base_url, _body("direct-extract", EXTRACT), lambda _: APPROVE)
    calling, approval, complete = stream.named
    assert calling.data["data"] == {"tool_type": "web_search"}  # no query for the extractor
    assert approval.data["tool"]["label"] == "Web page extraction"
    assert approval.data["arguments"] == {"url": "http://127.0.0.1:9/"}
    assert complete.raw == _progress(0, EXTRACT, "complete", _denied(EXTRACT_REFUSED))
    (engine_round,) = _run(tiny, "direct-extract")["rounds"]
    assert (engine_round["decision"], engine_round["by"]) == ("deny", "adapter")
    (result,) = _tool_results(tiny, "direct-extract")
    assert json.loads(result)["exception"] == EXTRACT_REFUSED


def test_auto_runs_without_an_approval_event_and_deny_with_the_engines_message(
    tiny: EngineAdapter,
) -> None:
    auto, posted = agentic_stream(
        tiny.base_url, _body("direct-auto", agent_permission="auto"), lambda _: APPROVE
    )
    assert posted == []
    assert [(e.data["phase"]) for e in auto.named] == ["calling", "complete"]
    assert _run(tiny, "direct-auto")["rounds"][0]["searched"] is True
    denied, posted = agentic_stream(
        tiny.base_url, _body("direct-policy", agent_permission="deny"), lambda _: APPROVE
    )
    assert posted == []
    complete: Named = denied.named[-1]
    assert complete.raw == _progress(
        0, SEARCH, "complete", _denied("Web search was denied by policy.")
    )
    assert _run(tiny, "direct-policy")["rounds"][0]["searched"] is False


def test_the_approval_route_answers_as_the_servers(tiny: EngineAdapter) -> None:
    url = tiny.base_url + "/v1/agent/approvals/appr_" + "0" * 32
    unknown = httpx.post(url, json=APPROVE, timeout=10)
    assert (unknown.status_code, unknown.json()) == (404, {"status": "not_found"})
    for body in ({}, {"decision": "maybe"}, {"decision": "deny", "message": 3}):
        refused = httpx.post(url, json=body, timeout=10)
        assert refused.status_code == 422, body
        assert refused.text.startswith("Failed to deserialize the JSON body")
    not_json = httpx.post(url, content=b"approve", timeout=10)
    assert not_json.status_code == 415


def test_ask_without_a_stream_is_refused_as_the_server_refuses_it(tiny: EngineAdapter) -> None:
    answer = httpx.post(
        tiny.base_url + "/v1/chat/completions", json=_body("direct-json", stream=False), timeout=30
    )
    assert answer.status_code == 422
    assert answer.json()["message"].startswith('agent_permission "ask" requires stream=true')


@pytest.fixture(scope="module")
def impatient() -> Iterator[EngineAdapter]:
    with running_adapter("tiny", extra_args=["--approval-timeout-s", "0.5"]) as adapter:
        yield adapter


def test_an_approval_nobody_decides_times_out_as_a_denial(impatient: EngineAdapter) -> None:
    stream, posted = agentic_stream(impatient.base_url, _body("direct-late"), lambda _: None)
    assert posted == []
    assert stream.named[-1].raw == _progress(0, SEARCH, "complete", _denied(TIMED_OUT))
    (engine_round,) = _run(impatient, "direct-late")["rounds"]
    assert (engine_round["by"], engine_round["searched"]) == ("timeout", False)
    (result,) = _tool_results(impatient, "direct-late")
    assert json.loads(result)["exception"] == TIMED_OUT
