"""Agentic chat streams (agents-media §3): the worker's event order and data
objects, approvals over ``POST /v1/agent/approvals/{id}``, sessions, and what
the simulator records for tests."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.testing.simulator import Simulator
from tests.testing.simulator.agentic import (
    APPROVAL,
    CHAT,
    CODE_TOOL,
    PROGRESS,
    UUID4,
    agentic,
    named,
    shape,
)
from tests.testing.simulator.wire import Event, Streaming, http_request, read_raw, sse_events


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    simulator = Simulator(id_seed=0xA6E7, chunks=2)
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def client(sim: Simulator) -> Iterator[httpx.Client]:
    sim.reset()
    with httpx.Client(base_url=sim.base_url, timeout=10) as c:
        yield c


def run(sim: Simulator, text: str, **extra: Any) -> list[Event]:
    raw = read_raw(sim.port, http_request(CHAT, agentic(text, **extra)))
    assert raw.status == 200 and raw.terminated, raw
    return sse_events(raw.body)


def approve_when_asked(stream: Streaming, client: httpx.Client, **decision: Any) -> str:
    assert stream.wait_for(b"event: " + APPROVAL.encode())
    (event,) = [e.json() for e in stream.events() if e.name == APPROVAL][-1:]
    answer = client.post(f"/v1/agent/approvals/{event['approval_id']}", json=decision)
    assert answer.status_code == 200, answer.text
    approval_id: str = event["approval_id"]
    return approval_id


# ------------------------------------------------------------ auto runs


def test_a_run_without_approvals_has_the_worker_order_and_data(sim: Simulator) -> None:
    sim.reset()
    directive = "[[sim agent=web:rust%20async,python,mcp:docs_lookup files=1 file_bytes=100]]"
    events = run(sim, "go " + directive)
    assert shape(events) == [
        "content", "calling:0", "complete:0",
        "content", "calling:1", "file_produced:1", "complete:1",
        "content", "calling:2", "file_produced:2", "complete:2",
        "content", "content", "finish", "done",
    ]  # fmt: skip
    progress = named(events, PROGRESS)
    assert progress[0] == {
        "type": PROGRESS,
        "round": 0,
        "tool_name": "mistralrs_search_the_web",
        "phase": "calling",
        "data": {"tool_type": "web_search", "query": "rust async"},
    }
    assert list(progress[0]) == ["type", "round", "tool_name", "phase", "data"]
    assert progress[1]["data"] == {
        "tool_type": "web_search",
        "results_count": 3,
        "sources": ["sim-search-1.example", "sim-search-2.example", "sim-search-3.example"],
    }
    assert progress[2]["data"] == {"tool_type": "code_execution", "code": 'print("sim-python-1")'}
    assert progress[3]["data"] == {
        "tool_type": "code_execution",
        "stdout": "sim-stdout-1\n",
        "working_directory": "/sim/work",
        "execution_time_ms": 5,
    }
    assert progress[4]["tool_name"] == "docs_lookup"
    assert progress[4]["data"] == {"tool_type": "custom", "arguments": '{"sim_round":2}'}
    assert json.loads(progress[5]["data"]["content"])["tool"] == "docs_lookup"
    chunks = [e.json() for e in events if e.name is None and e.data != b"[DONE]"]
    # each round is its own engine request: its own chunk id
    ids = [int(c["id"]) for c in chunks]
    assert ids[1] == ids[0] + 1 and ids[2] == ids[0] + 2 and set(ids[3:]) == {ids[0] + 3}
    assert chunks[0]["choices"][0]["delta"]["content"] == "sim-round-0-token-0 "
    final = chunks[-1]
    assert list(final)[-2:] == ["usage", "session_id"] and re.fullmatch(UUID4, final["session_id"])
    usage = final["usage"]
    assert usage["completion_tokens"] == 3 * 2 + 2  # (round_chunks + the call) a round, the answer
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert all("session_id" not in c for c in chunks[:-1])
    (record,) = sim.agent_runs()
    assert record.request_seq == sim.requests()[0].seq
    assert record.session_id == final["session_id"] and record.requested_session_id is None
    assert record.plan == ("web:rust async", "python", "mcp:docs_lookup")
    assert [(r.round, r.outcome) for r in record.rounds] == [(0, "auto"), (1, "auto"), (2, "auto")]


def test_files_are_real_bytes_and_elided_over_8_mib(sim: Simulator) -> None:
    sim.reset()
    events = run(sim, "[[sim agent=python files=2 file_bytes=3000 file_mime=image/png]]")
    files = named(events, "file_produced")
    assert [f["id"] for f in files] == [files[0]["id"][:-1] + "0", files[0]["id"][:-1] + "1"]
    assert re.fullmatch(r"file_[0-9a-f]{12}_r0_0", files[0]["id"])
    first = files[0]
    assert list(first) == [
        "id", "name", "format", "mime_type", "bytes", "created_at", "purpose", "source",
        "data_base64",
    ]  # fmt: skip
    assert first["name"] == "sim-r0-0.png" and first["format"] == "png"
    assert first["purpose"] == "agent_output"
    assert first["source"] == {"tool": "mistralrs_execute_python", "round": 0, "turn": 0}
    data = base64.b64decode(first["data_base64"])
    assert len(data) == first["bytes"] == 3000 and data.startswith(b"\x89PNG\r\n\x1a\n")
    big = named(
        run(sim, "[[sim agent=python files=1 file_bytes=9000000 file_mime=text/csv]]"),
        "file_produced",
    )
    assert big[0]["bytes"] == 9_000_000 and "text" not in big[0] and "data_base64" not in big[0]
    assert big[0]["preview"].startswith("sim-file r0 n0\n") and len(big[0]["preview"]) == 4096
    searched = run(sim, "[[sim agent=web files=3]]")  # the worker's search produces no file
    assert named(searched, "file_produced") == []


def test_sessions_echo_fresh_and_spliced(sim: Simulator) -> None:
    sim.reset()
    echoed = run(sim, "[[sim agent=python]]", session_id="gs_abc")
    assert echoed[-2].json()["session_id"] == "gs_abc"
    messages = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "next [[sim agent=web]]"},
    ]
    fresh = run(sim, "x", messages=messages[:1])[-2].json()["session_id"]
    spliced = run(sim, "x", messages=messages)[-2].json()["session_id"]
    assert spliced == fresh and fresh != "gs_abc"  # the worker splices across callers
    own = run(sim, "x", messages=messages, session_id="gs_other")[-2].json()["session_id"]
    assert own == "gs_other"
    runs = sim.agent_runs()
    assert [(r.requested_session_id, r.session_id) for r in runs] == [
        ("gs_abc", "gs_abc"),
        (None, fresh),
        (None, fresh),
        ("gs_other", "gs_other"),
    ]
    assert set(sim.sessions()) == {"gs_abc", fresh, "gs_other"}


def test_max_tool_rounds_caps_the_loop_as_the_worker_does(sim: Simulator) -> None:
    sim.reset()
    raw = read_raw(
        sim.port, http_request(CHAT, agentic("[[sim agent=web,web,web]]", max_tool_rounds=2))
    )
    events = sse_events(raw.body)
    # two rounds, then the model calls a third tool: its content, then the channel is dropped
    assert shape(events) == [
        "content",
        "calling:0",
        "complete:0",
        "content",
        "calling:1",
        "complete:1",
        "content",
    ]
    assert raw.terminated and b"[DONE]" not in raw.body
    assert shape(run(sim, "[[sim agent=web]]", max_tool_rounds=0)) == ["content"]


def test_non_streamed_run_carries_records_files_and_session(client: httpx.Client) -> None:
    text = "[[sim agent=web:q,python files=1 file_bytes=10 file_mime=text/plain]]"
    body = client.post(CHAT, json=agentic(text, stream=False, session_id="gs_1")).json()
    assert list(body)[-4:] == ["usage", "agentic_tool_calls", "files", "session_id"]
    assert body["session_id"] == "gs_1" and body["usage"]["completion_tokens"] == 2 * 2 + 2
    calls = body["agentic_tool_calls"]
    assert calls[0] == {
        "round": 0,
        "name": "mistralrs_search_the_web",
        "arguments": '{"query":"q"}',
        "result_content": "3 results\nsources: "
        "sim-search-1.example, sim-search-2.example, sim-search-3.example",
    }
    assert calls[1]["result_content"] == "stdout: sim-stdout-1\n"
    assert calls[1]["file_ids"] == [body["files"][0]["id"]]
    assert body["files"][0]["text"] == "sim-file r"
    refused = client.post(CHAT, json=agentic("x", stream=False, agent_permission="ask"))
    assert refused.status_code == 422
    assert refused.json()["message"].startswith('agent_permission "ask" requires stream=true')


# ----------------------------------------------------------- approvals


def test_ask_waits_for_the_decision_then_runs_the_tool(
    sim: Simulator, client: httpx.Client
) -> None:
    body = agentic(
        "[[sim agent=python files=1 keepalive_ms=20]]", agent_permission="ask", session_id="gs_s"
    )
    stream = Streaming(sim.port, http_request(CHAT, body))
    assert stream.wait_for(b"event: " + APPROVAL.encode())
    assert sim.wait_for(lambda: len(sim.pending_approvals()) == 1, 5)
    keepalive = b"3\r\n:\n\n\r\n"  # a chunk frame of ":\n\n"
    assert stream.wait_for(keepalive * 2)  # keep-alives while the worker waits
    approval_id = approve_when_asked(stream, client, decision="approve")
    raw = stream.result()
    events = sse_events(raw.body)
    assert shape(events) == [
        "content", "calling:0", f"{APPROVAL}:0", "file_produced:0", "complete:0",
        "content", "content", "finish", "done",
    ]  # fmt: skip
    (event,) = named(events, APPROVAL)
    assert list(event) == ["type", "approval_id", "session_id", "round", "tool", "arguments"]
    assert re.fullmatch(r"appr_[0-9a-f]{32}", approval_id) and event["approval_id"] == approval_id
    assert event["session_id"] == "gs_s" and event["round"] == 0
    assert event["tool"] == {"source": "built_in", "kind": "code_execution", "label": "Python code"}
    assert event["arguments"] == {"code": 'print("sim-python-0")'}
    (decision,) = sim.approval_decisions()
    assert (decision.approval_id, decision.decision, decision.status) == (
        approval_id,
        "approve",
        "resolved",
    )
    assert decision.remember_for_session is False and decision.message is None
    (record,) = sim.agent_runs()
    assert record.approvals == [approval_id] and record.permission == "ask"
    assert [(r.outcome, r.approval_id) for r in record.rounds] == [("approved", approval_id)]
    assert sim.pending_approvals() == []


@pytest.mark.parametrize(
    ("entry", "denied"),
    [
        ("python", {"tool_type": "code_execution", "exception": "not here"}),
        (
            "web",
            {"tool_type": "custom", "content": '{"status":"denied","exception":"not here"}'},
        ),
        (
            "url:https://www.docs.example.com/a",
            {"tool_type": "custom", "content": '{"status":"denied","exception":"not here"}'},
        ),
        (
            "shell:ls",
            {
                "tool_type": "shell",
                "commands": ["ls"],
                "stderr": "not here",
                "status": "denied",
                "timed_out": False,
            },
        ),
    ],
)
def test_a_denial_is_reported_as_the_worker_reports_it(
    sim: Simulator, client: httpx.Client, entry: str, denied: dict[str, Any]
) -> None:
    body = agentic(f"[[sim agent={entry} files=2]]", agent_permission="ask", enable_shell=True)
    stream = Streaming(sim.port, http_request(CHAT, body))
    approve_when_asked(stream, client, decision="deny", message="not here")
    events = sse_events(stream.result().body)
    assert named(events, "file_produced") == []
    assert named(events, PROGRESS)[-1]["data"] == denied
    assert sim.agent_runs()[0].rounds[0].outcome == "denied"


def test_url_rounds_show_the_url_to_approve(sim: Simulator, client: httpx.Client) -> None:
    body = agentic("[[sim agent=url:https://www.docs.example.com/a%20b]]", agent_permission="ask")
    stream = Streaming(sim.port, http_request(CHAT, body))
    approve_when_asked(stream, client, decision="approve")
    events = sse_events(stream.result().body)
    calling, complete = named(events, PROGRESS)
    assert calling["tool_name"] == "mistralrs_website_content_extractor"
    assert calling["data"] == {"tool_type": "web_search"}  # the extractor has no query
    (approval,) = named(events, APPROVAL)
    assert approval["tool"] == {
        "source": "built_in",
        "kind": "web_search",
        "label": "Web page extraction",
    }
    assert approval["arguments"] == {"url": "https://www.docs.example.com/a b"}
    assert complete["data"] == {
        "tool_type": "web_search",
        "results_count": 1,
        "sources": ["docs.example.com"],
    }


def test_a_decision_before_the_wait_is_queued(sim: Simulator, client: httpx.Client) -> None:
    body = agentic("[[sim agent=python approval_delay_ms=3000]]", agent_permission="ask")
    stream = Streaming(sim.port, http_request(CHAT, body))
    assert stream.wait_for(b"event: " + APPROVAL.encode())
    (event,) = named(stream.events(), APPROVAL)
    queued = client.post(f"/v1/agent/approvals/{event['approval_id']}", json={"decision": "deny"})
    assert (queued.status_code, queued.json()) == (200, {"status": "queued"})
    again = client.post(f"/v1/agent/approvals/{event['approval_id']}", json={"decision": "approve"})
    assert (again.status_code, again.json()) == (404, {"status": "not_found"})
    events = sse_events(stream.result().body)
    assert named(events, PROGRESS)[-1]["data"] == {
        "tool_type": "code_execution",
        "exception": "Agent action was denied.",
    }
    assert [d.status for d in sim.approval_decisions()] == ["queued", "not_found"]


def test_the_approval_route_answers_as_the_worker(sim: Simulator, client: httpx.Client) -> None:
    missing = client.post("/v1/agent/approvals/appr_" + "0" * 32, json={"decision": "approve"})
    assert (missing.status_code, missing.json()) == (404, {"status": "not_found"})
    bodies: list[Any] = [
        {"decision": "maybe"},
        {},
        {"decision": "approve", "remember_for_session": None},
        [],
    ]
    for body in bodies:
        bad = client.post("/v1/agent/approvals/appr_x", json=body)
        assert bad.status_code == 422 and bad.headers["content-type"].startswith("text/plain"), body
    assert client.get("/v1/agent/approvals/appr_x").status_code == 405
    assert client.post("/v1/agent/approvals/", json={"decision": "deny"}).status_code == 404
    assert client.post("/v1/agent/approvals/a/b", json={"decision": "deny"}).status_code == 404
    unjson = client.post(
        "/v1/agent/approvals/appr_x", content=b"{}", headers={"content-type": "text/plain"}
    )
    assert unjson.status_code == 415
    assert [(d.approval_id, d.status) for d in sim.approval_decisions()] == [
        ("appr_" + "0" * 32, "not_found")
    ]


def test_the_wait_times_out_into_a_denial(sim: Simulator) -> None:
    sim.reset()
    events = run(sim, "[[sim agent=python approval_timeout_s=0.2]]", agent_permission="ask")
    assert named(events, PROGRESS)[-1]["data"] == {
        "tool_type": "code_execution",
        "exception": "Approval timed out.",
    }
    assert sim.agent_runs()[0].rounds[0].outcome == "timeout"
    assert sim.pending_approvals() == []


def test_hanging_up_while_an_approval_is_pending(sim: Simulator, client: httpx.Client) -> None:
    stream = Streaming(
        sim.port, http_request(CHAT, agentic("[[sim agent=python]]", agent_permission="ask"))
    )
    assert stream.wait_for(b"event: " + APPROVAL.encode())
    (event,) = named(stream.events(), APPROVAL)
    assert sim.wait_for(lambda: sim.pending_approvals() == [event["approval_id"]], 5)
    stream.hang_up()
    assert sim.wait_for(lambda: sim.agent_runs()[0].abandoned_approval is not None, 5)
    assert sim.agent_runs()[0].abandoned_approval == event["approval_id"]
    assert sim.wait_for(lambda: sim.pending_approvals() == [] and sim.active_streams == 0, 5)
    late = client.post(f"/v1/agent/approvals/{event['approval_id']}", json={"decision": "approve"})
    assert late.status_code == 404
    assert sim.requests()[0].disconnected_at is not None


def test_remember_for_session_skips_later_approvals(sim: Simulator, client: httpx.Client) -> None:
    body = agentic("[[sim agent=python,web]]", agent_permission="ask", session_id="gs_r")
    stream = Streaming(sim.port, http_request(CHAT, body))
    approve_when_asked(stream, client, decision="approve", remember_for_session=True)
    events = sse_events(stream.result().body)
    assert shape(events)[:7] == [
        "content",
        "calling:0",
        f"{APPROVAL}:0",
        "complete:0",
        "content",
        "calling:1",
        "complete:1",
    ]
    again = run(sim, "[[sim agent=python]]", agent_permission="ask", session_id="gs_r")
    assert named(again, APPROVAL) == []
    assert [r.outcome for r in sim.agent_runs()[1].rounds] == ["remembered"]
    assert sim.approval_decisions()[0].remember_for_session is True


def test_permission_deny_and_the_worker_flag(sim: Simulator) -> None:
    sim.reset()
    events = run(sim, "[[sim agent=python,mcp:docs_x]]", agent_permission="deny")
    assert named(events, APPROVAL) == []
    data = [p["data"] for p in named(events, PROGRESS) if p["phase"] == "complete"]
    assert data == [
        {"tool_type": "code_execution", "exception": "Python code was denied by policy."},
        {
            "tool_type": "custom",
            "content": '{"status":"denied","exception":"docs_x was denied by policy."}',
        },
    ]
    sim.set_knobs(agent_permission="deny")  # the worker's --agent-permission: the strictest wins
    try:
        assert named(run(sim, "[[sim agent=python]]", agent_permission="auto"), PROGRESS)[-1][
            "data"
        ]["exception"]
    finally:
        sim.set_knobs(agent_permission="auto")
    assert [r.permission for r in sim.agent_runs()] == ["deny", "deny"]


# ------------------------------------------------------------- requests


def test_what_makes_a_request_agentic_and_what_is_refused(
    sim: Simulator, client: httpx.Client
) -> None:
    plain = {"messages": "[[sim agent=python]]"}
    refused = client.post(CHAT, json=plain)
    assert refused.status_code == 400 and refused.text.startswith(
        "simulator: agent and agent_fault need"
    )
    rounds_only = client.post(CHAT, json={"messages": "[[sim agent=mcp:x]]", "max_tool_rounds": 4})
    assert (
        rounds_only.status_code == 200
        and rounds_only.json()["agentic_tool_calls"][0]["name"] == "x"
    )
    no_web = client.post(CHAT, json={"messages": "[[sim agent=web]]", "max_tool_rounds": 4})
    assert no_web.status_code == 400 and "web_search_options" in no_web.text
    no_code = client.post(CHAT, json={"messages": "[[sim agent=python]]", "web_search_options": {}})
    assert no_code.status_code == 400 and "code_interpreter" in no_code.text
    assert client.post(CHAT, json=agentic("x", agent_permission="maybe")).status_code == 422
    assert client.post(CHAT, json=agentic("x", max_tool_rounds=-1)).status_code == 422
    assert client.post(CHAT, json=agentic("x", session_id=5)).status_code == 422
    container = client.post(
        CHAT, json=agentic("x", tools=[{"type": "code_interpreter", "container": "cntr_1"}])
    )
    assert (
        container.status_code == 500
        and "container IDs are not supported" in container.json()["message"]
    )
    assert client.post(CHAT, json=agentic("[[sim fault=gzip]]")).status_code == 400
    assert [r.plan for r in sim.agent_runs()] == [("mcp:x",)]


def test_a_default_plan_is_for_agentic_requests_only() -> None:
    simulator = Simulator(agent="python", agent_permission="ask", chunks=1)
    simulator.start()
    try:
        with httpx.Client(base_url=simulator.base_url, timeout=5) as c:
            assert c.post(CHAT, json={"messages": "hi"}).json()["usage"]["completion_tokens"] == 1
            refused = c.post(CHAT, json={"messages": "hi", "tools": [CODE_TOOL]})
            assert refused.status_code == 422  # ask needs a stream
    finally:
        simulator.stop()


def test_chat_faults_shape_the_answer_of_an_agentic_run(sim: Simulator) -> None:
    raw = read_raw(sim.port, http_request(CHAT, agentic("[[sim agent=web fault=missing_done]]")))
    assert shape(sse_events(raw.body)) == [
        "content",
        "calling:0",
        "complete:0",
        "content",
        "content",
        "finish",
    ]
    usage = sse_events(
        read_raw(
            sim.port,
            http_request(
                CHAT, agentic("[[sim agent=web,web fault=too_many_tokens]]", max_tokens=10)
            ),
        ).body
    )[-2].json()["usage"]
    assert usage["completion_tokens"] == 10 * 3 + 1  # over max_tokens x (rounds + 1)
