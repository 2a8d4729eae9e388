"""The handlers of the agentic surface: an agentic chat request's
:class:`~handling.Job`, and ``POST /v1/agent/approvals/{approval_id}``. Runs on
the event loop.

Agentic chat (after the chat checks of handlers.py; agent_input.py decides
that a request is agentic): the effective permission is the strictest of the
``agent_permission`` knob (the worker's flag) and the request's; ``ask``
without ``stream: true`` is the worker's 422. Then the simulator's own
checks, 400 ``simulator: ...``: a plan entry whose tool the request did not
enable (``web``/``url`` need ``web_search_options``, ``python`` a
``code_interpreter`` tool, ``shell`` ``enable_shell``), and an
``agent_fault`` that could not happen with this plan and permission. A request
without ``session_id`` may take over a stored session (broker.py).

Approvals (``approvals.rs``): a JSON body ``{"decision": "approve"|"deny",
"remember_for_session"?: bool, "message"?: string|null}`` (anything else is
axum's 422 text); 200 ``{"status":"resolved"}`` when a call was waiting (its
waiter is woken here, after the lock is released), 200 ``{"status":"queued"}``
when the event went out but the wait has not begun, 404
``{"status":"not_found"}`` otherwise. Every decision received is recorded.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from gateway.testing.simulator.agent_input import DEFAULT_MAX_TOOL_ROUNDS, AgentRequest, strictest
from gateway.testing.simulator.agent_notes import Decision
from gateway.testing.simulator.agent_plan import PlanEntry, parse_plan
from gateway.testing.simulator.agents import Agentic, plan_agentic
from gateway.testing.simulator.broker import ApprovalRecord
from gateway.testing.simulator.chat import Ctx
from gateway.testing.simulator.handling import Job, read_json
from gateway.testing.simulator.plans import Reject, Step, json_reply, simple_reply
from gateway.testing.simulator.state import State

APPROVALS = "/v1/agent/approvals/"
ASK_NEEDS_STREAM = (
    'agent_permission "ask" requires stream=true over HTTP; approve or deny emitted '
    "requests with POST /v1/agent/approvals/{approval_id}."
)
_NEEDS = {"web": "web", "url": "web", "python": "python", "shell": "shell"}
_ENABLED_BY = {
    "web": "web_search_options",
    "python": "a code_interpreter tool",
    "shell": "enable_shell",
}
_FILE_KINDS = ("python", "mcp", "tool", "shell")


def _simulator(problem: str) -> Reject:
    return Reject(400, f"simulator: {problem}", as_json=False)


def _check_plan(plan: tuple[PlanEntry, ...], agent: AgentRequest) -> None:
    enabled = {"web": agent.web, "python": agent.python, "shell": agent.shell}
    for entry in plan:
        need = _NEEDS.get(entry.kind)
        if need is not None and not enabled[need]:
            raise _simulator(f"agent round {entry.kind} needs {_ENABLED_BY[need]} in the request")


def _check_fault(fault: str | None, a: Agentic, files: int) -> None:
    """Refuse an agent_fault that this run could not show (it would pass silently)."""
    if fault is None:
        return
    rounds = a.executed
    if fault != "unknown_event" and rounds < 1:
        raise _simulator(f"agent_fault {fault!r} needs a tool round (agent=...)")
    if fault == "round_regress" and rounds < 2:
        raise _simulator("agent_fault 'round_regress' needs two tool rounds")
    if fault in ("two_approvals", "stale_approval") and a.permission != "ask":
        raise _simulator(f"agent_fault {fault!r} needs agent_permission ask")
    if fault == "ran_after_deny" and a.permission == "auto":
        raise _simulator("agent_fault 'ran_after_deny' needs agent_permission ask or deny")
    if fault in ("oversize_file", "file_bytes_mismatch") and (
        files < 1 or a.plan[0].kind not in _FILE_KINDS
    ):
        raise _simulator(
            f"agent_fault {fault!r} needs files>=1 and a python/mcp/tool/shell round 0"
        )


def messages_of(req: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each message of a chat body (already checked by handlers.py)."""
    messages = req.get("messages")
    if isinstance(messages, str):
        return [("user", messages)]
    pairs: list[tuple[str, str]] = []
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            content = " ".join(p for p in parts if isinstance(p, str))
        pairs.append((m["role"], content if isinstance(content, str) else ""))
    return pairs


def agentic_job(state: State, ctx: Ctx, agent: AgentRequest) -> Job:
    """The Job of an agentic chat request (raises :class:`Reject`)."""
    k = ctx.knobs
    permission = strictest(k.agent_permission, agent.permission)
    if permission == "ask" and not ctx.stream:
        raise Reject.handler(422, ASK_NEEDS_STREAM)
    plan = parse_plan(k.agent)
    _check_plan(plan, agent)
    with state.cond:
        seed = state.id_seed
        spliced = None
        if agent.session_id is None:
            spliced = state.sessions.find(agent.messages, time.monotonic())
    max_rounds = DEFAULT_MAX_TOOL_ROUNDS if agent.max_tool_rounds is None else agent.max_tool_rounds
    run = Agentic(
        ctx,
        seed,
        permission,
        max_rounds,
        plan,
        agent.session_id,
        spliced,
        agent.allowed_domains,
        agent.messages,
        agent.turn,
    )
    _check_fault(k.agent_fault, run, k.files)
    numbers = run.executed + 1  # one engine request a generation
    return Job(
        ctx.stream,
        k,
        lambda n: plan_agentic(dataclasses.replace(run, ctx=dataclasses.replace(ctx, number=n))),
        numbers,
    )


# ------------------------------------------------------------- approvals


def _decision(req: Any) -> Decision:
    if not isinstance(req, dict):
        raise Reject.shape("invalid type: expected struct ApprovalDecisionRequest")
    if "decision" not in req:
        raise Reject.shape("missing field `decision`")
    decision = req["decision"]
    if decision not in ("approve", "deny"):
        raise Reject.shape(f"decision: unknown variant `{decision}`, expected `approve` or `deny`")
    remember = req.get("remember_for_session", False)
    if not isinstance(remember, bool):
        raise Reject.shape("remember_for_session: invalid type, expected a boolean")
    message = req.get("message")
    if message is not None and not isinstance(message, str):
        raise Reject.shape("message: invalid type, expected a string")
    return Decision(decision == "approve", remember, message, "caller")


def approval(
    state: State, method: str, path: str, body: bytes, headers: dict[str, str], rid: str
) -> Iterator[Step]:
    approval_id = path[len(APPROVALS) :]
    if not approval_id or "/" in approval_id:
        return simple_reply(404, b"", rid)
    if method != "POST":
        return simple_reply(405, b"", rid)
    try:
        decision = _decision(read_json(body, headers))
    except Reject as reject:
        return reject.reply(rid)
    verb = "approve" if decision.approve else "deny"
    record = ApprovalRecord(
        approval_id, verb, decision.remember_for_session, decision.message, "", time.monotonic()
    )
    with state.cond:
        wake = state.approvals.resolve(approval_id, decision, record)
        state.cond.notify_all()
    if wake is not None:
        wake(decision)  # on this loop: the waiting reply resumes with it
    status = 404 if record.status == "not_found" else 200
    return json_reply(status, {"status": record.status}, rid)
