"""Every ``agent_fault`` (``AGENT_FAULTS``) produces the violation a gateway's
agentic state machine must catch (spec §22 "Events"), and only that."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gateway.testing.simulator import AGENT_FAULTS, Simulator
from tests.testing.simulator.agentic import APPROVAL, PROGRESS, agentic, named, shape
from tests.testing.simulator.wire import Event, Raw, Streaming, http_request, read_raw, sse_events

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    simulator = Simulator(id_seed=0xFA17, chunks=1)
    simulator.start()
    yield simulator
    simulator.stop()


@dataclass(frozen=True)
class Case:
    knobs: str  # directive text besides the fault
    check: Callable[[list[Event], Raw], bool]
    body: dict[str, Any] = field(default_factory=dict)


def _rounds(events: list[Event]) -> list[int]:
    return [p["round"] for p in named(events, PROGRESS)]


def _done(raw: Raw) -> bool:
    return raw.body.endswith(b"data: [DONE]\n\n")


def _file(events: list[Event]) -> tuple[int, int]:
    """(declared bytes, decoded bytes) of the first file."""
    first = named(events, "file_produced")[0]
    return first["bytes"], len(base64.b64decode(first["data_base64"]))


ASK: dict[str, Any] = {"agent_permission": "ask"}
CASES: dict[str, Case] = {
    "unknown_event": Case(
        "agent=web",
        lambda e, r: (
            shape(e)[1:4] == ["calling:0", "agentic_sim_unknown:0", "complete:0"] and _done(r)
        ),
    ),
    "complete_without_calling": Case(
        "agent=web", lambda e, r: shape(e)[:2] == ["content", "complete:0"] and _done(r)
    ),
    "round_regress": Case("agent=web,web", lambda e, r: _rounds(e) == [0, 0, 0, 0] and _done(r)),
    "round_over_max": Case(
        "agent=web,web", lambda e, r: _rounds(e) == [0, 0, 2, 2], {"max_tool_rounds": 2}
    ),
    "two_approvals": Case(
        "agent=python approval_timeout_s=0.2",
        lambda e, r: (
            shape(e)[1:4] == ["calling:0", f"{APPROVAL}:0", f"{APPROVAL}:0"]
            and len({a["approval_id"] for a in named(e, APPROVAL)}) == 2
            and _done(r)
        ),
        ASK,
    ),
    "content_in_round": Case(
        "agent=web", lambda e, r: shape(e)[:4] == ["content", "calling:0", "content", "complete:0"]
    ),
    "end_in_round": Case(
        "agent=web", lambda e, r: shape(e) == ["content", "calling:0"] and r.terminated
    ),
    "done_in_round": Case("agent=web", lambda e, r: shape(e) == ["content", "calling:0", "done"]),
    "ran_after_deny": Case(
        "agent=python",
        lambda e, r: named(e, PROGRESS)[1]["data"]["stdout"] == "sim-stdout-0\n",
        {"agent_permission": "deny"},
    ),
    "file_outside_round": Case(
        "agent=python files=1",
        lambda e, r: (
            shape(e)[1:5] == ["calling:0", "file_produced:0", "complete:0", "file_produced:0"]
        ),
    ),
    "oversize_file": Case(
        "agent=python files=1 file_bytes=100", lambda e, r: _file(e) == (4296, 4296)
    ),
    "file_bytes_mismatch": Case(
        "agent=python files=1 file_bytes=100", lambda e, r: _file(e) == (101, 100)
    ),
    "approval_outside_round": Case(
        "agent=web",
        lambda e, r: shape(e)[:3] == [f"{APPROVAL}:0", "content", "calling:0"] and _done(r),
    ),
}


def test_every_agent_fault_has_a_case() -> None:
    assert set(CASES) | {"stale_approval"} == AGENT_FAULTS


@pytest.mark.parametrize("fault", sorted(CASES))
def test_agent_fault_produces_its_violation(sim: Simulator, fault: str) -> None:
    sim.reset()
    case = CASES[fault]
    body = agentic(f"[[sim {case.knobs} agent_fault={fault}]]", **case.body)
    raw = read_raw(sim.port, http_request(CHAT, body))
    assert raw.status == 200, raw
    events = sse_events(raw.body)
    assert case.check(events, raw), shape(events)


def test_stale_approval_is_refused_then_times_out(sim: Simulator) -> None:
    sim.reset()
    text = "[[sim agent=python approval_timeout_s=0.5 agent_fault=stale_approval]]"
    stream = Streaming(sim.port, http_request(CHAT, agentic(text, **ASK)))
    assert stream.wait_for(b"event: " + APPROVAL.encode())
    (event,) = named(stream.events(), APPROVAL)
    with httpx.Client(base_url=sim.base_url, timeout=5) as c:
        refused = c.post(
            f"/v1/agent/approvals/{event['approval_id']}", json={"decision": "approve"}
        )
    assert (refused.status_code, refused.json()) == (404, {"status": "not_found"})
    events = sse_events(stream.result().body)
    assert named(events, PROGRESS)[-1]["data"]["exception"] == "Approval timed out."
    (run,) = sim.agent_runs()
    assert run.approvals != [event["approval_id"]]  # the id waited on is another


@pytest.mark.parametrize(
    ("text", "extra", "problem"),
    [
        ("agent=web agent_fault=round_regress", {}, "needs two tool rounds"),
        ("agent_fault=end_in_round", {}, "needs a tool round"),
        ("agent=python agent_fault=two_approvals", {}, "needs agent_permission ask"),
        ("agent=python agent_fault=ran_after_deny", {}, "needs agent_permission ask or deny"),
        ("agent=python agent_fault=oversize_file", {}, "needs files>=1"),
        ("agent=web files=1 agent_fault=file_bytes_mismatch", {}, "needs files>=1"),
        ("agent=web agent_fault=sideways", {}, "unknown agent_fault"),
        ("agent=web agent_fault=end_in_round", {"max_tool_rounds": 0}, "needs a tool round"),
        ("agent_fault=approval_outside_round", {}, "needs a tool round"),
    ],
)
def test_a_fault_that_could_not_show_is_refused(
    sim: Simulator, text: str, extra: dict[str, Any], problem: str
) -> None:
    with httpx.Client(base_url=sim.base_url, timeout=5) as c:
        refused = c.post(CHAT, json=agentic(f"[[sim {text}]]", **extra))
    assert refused.status_code == 400 and refused.text.startswith("simulator:"), refused.text
    assert problem in refused.text
