"""Agentic ``/v1/chat/completions`` runs, as ``agentic_loop.rs`` streams them
(agents-media §3.4). Pure: the decisions a run depends on come back through
the notes of agent_notes.py.

Each round of the ``agent`` plan (agent_plan.py; rounds from 0, at most
``max_tool_rounds``, else 256) is one generation of the model, and so one
engine request with its own chunk ``id`` (the run takes consecutive numbers).
Its bytes, in order:

1. ``round_chunks`` content chunks (``sim-round-<r>-token-<i> ``); the chunk
   carrying the tool call is suppressed, as the worker does;
2. ``event: agentic_tool_call_progress`` ``phase: "calling"`` (agent_tools.py);
3. under ``agent_permission`` ask (the strictest of the simulator's knob and
   the request's), unless the session's actions were approved before
   (``remember_for_session``): ``event: agentic_tool_approval_required``
   ``{"type","approval_id":"appr_<32 hex>","session_id","round","tool":
   {"source","kind","label"},"arguments"}``, then, after ``approval_delay_ms``,
   the wait for ``POST /v1/agent/approvals/{approval_id}`` (at most
   ``approval_timeout_s``; then denied "Approval timed out."). Under deny no
   event: the call is denied "<label> was denied by policy.";
4. approved: ``files`` times ``event: file_produced`` (python, custom and shell
   rounds only; bodies over 8 MiB elided, agent_tools.py);
5. ``phase: "complete"`` with the tool's output, or with the denial as the
   worker reports it.

Then the answer: the chat stream of chat.py (``chunks``, ``first_delay_ms``,
its faults), its finish chunk carrying the usage of every generation summed
(each round: prompt + 16 tokens a round before it, ``round_chunks`` + 1
completion tokens) and ``session_id``, then ``[DONE]``. A plan longer than
``max_tool_rounds`` makes the model call one more tool than allowed: that
generation's content chunks, then the stream ends with no finish chunk and
no ``[DONE]``, as the worker's does. ``session_id``: the request's, else a
stored session whose messages start the request's (≥ 2 messages; the worker's
splicing), else a fresh uuid4-shaped id; saved at the end of the rounds.

Non-streamed (never with ask: that is 422 before anything), the rounds run
without events and the JSON answer adds ``agentic_tool_calls``, ``files`` and
``session_id`` after ``usage``.

``agent_fault`` (``AGENT_FAULTS``; round 0 unless said): ``unknown_event``
(``event: agentic_sim_unknown`` after the calling event, or before the answer
when there is no round), ``complete_without_calling`` (no calling event),
``round_regress`` (round 1 numbered 0), ``round_over_max`` (the last round
numbered ``max_tool_rounds``), ``two_approvals`` (a second approval event,
another id, right after the first), ``content_in_round`` (a content chunk
after the calling event), ``end_in_round`` / ``done_in_round`` (the stream
ends after the calling event and the approval event, if any, without /
with ``[DONE]``), ``ran_after_deny`` (a denied call's complete event shows it
ran), ``file_outside_round`` (a ``file_produced`` after the complete event),
``oversize_file`` (the first file is ``2 * file_bytes + 4096`` bytes),
``file_bytes_mismatch`` (its ``bytes`` says one more than it has),
``approval_outside_round`` (an approval event, never announced, before
round 0's calling event), ``stale_approval`` (the event's id is not the one
waited on: posting it answers 404, and the wait times out).
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.simulator.agent_notes import (
    Announce,
    AwaitDecision,
    Decision,
    RoundDone,
    RunStart,
    SaveSession,
)
from gateway.testing.simulator.agent_plan import PlanEntry
from gateway.testing.simulator.agent_tools import (
    FileSpec,
    ToolCall,
    file_event_data,
    tool_call,
)
from gateway.testing.simulator.chat import (
    Ctx,
    Spent,
    json_bytes,
    json_dict,
    make_chunk,
    seconds,
    sse_chunk,
    stream_body,
    total_delay,
)
from gateway.testing.simulator.plans import (
    DONE_EVENT,
    Envelope,
    Op,
    Pause,
    PlanStep,
    SseBody,
    dump,
    envelope,
    sim_uuid,
)

PROMPT_PER_ROUND = 16
_SESSION_KIND, _APPROVAL_KIND, _STALE_KIND, _SECOND_KIND, _OUTSIDE_KIND = (
    0x600, 0x700, 0x780, 0x7C0, 0x7FF,
)  # fmt: skip
UNKNOWN_EVENT = b'event: agentic_sim_unknown\ndata: {"type":"agentic_sim_unknown","round":0}\n\n'


@dataclass(frozen=True, slots=True)
class Agentic:
    """One agentic chat request, as the handler read it."""

    ctx: Ctx  # the chat request; ``number`` is the run's first engine number
    seed: int
    permission: str  # effective: the strictest of the worker's and the request's
    max_rounds: int
    plan: tuple[PlanEntry, ...]
    requested_session_id: str | None
    spliced_session_id: str | None
    allowed_domains: tuple[str, ...]
    messages: tuple[tuple[str, str], ...]
    turn: int

    @property
    def executed(self) -> int:
        return min(len(self.plan), self.max_rounds)

    @property
    def session_id(self) -> str:
        fresh = sim_uuid(self.seed, self.ctx.number, _SESSION_KIND)
        return self.requested_session_id or self.spliced_session_id or fresh

    def approval_id(self, kind: int) -> str:
        """``appr_`` + 32 hex, uuid4-shaped like the worker's, from the seed, number, kind."""
        digest = hashlib.sha256(f"appr:{self.seed}:{self.ctx.number}:{kind}".encode()).digest()
        return "appr_" + uuid.UUID(bytes=digest[:16], version=4).hex

    @property
    def run_id(self) -> str:
        return hashlib.sha256(f"{self.seed}:{self.ctx.number}".encode()).hexdigest()[:12]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dump(data) + b"\n\n"


def _progress(call: ToolCall, wire_round: int, phase: str, data: dict[str, Any]) -> bytes:
    body = {"type": "agentic_tool_call_progress", "round": wire_round, "tool_name": call.name}
    return _event("agentic_tool_call_progress", {**body, "phase": phase, "data": data})


def _approval(a: Agentic, approval_id: str, call: ToolCall, wire_round: int) -> bytes:
    body: dict[str, Any] = {"type": "agentic_tool_approval_required", "approval_id": approval_id}
    body.update(session_id=a.session_id, round=wire_round, tool=call.metadata)
    return _event(
        "agentic_tool_approval_required", {**body, "arguments": orjson.loads(call.arguments)}
    )


def _file(a: Agentic, call: ToolCall, index: int) -> bytes:
    k = a.ctx.knobs
    size, declared = k.file_bytes, None
    first = call.round == 0 and index == 0
    if first and k.agent_fault == "oversize_file":
        size = 2 * k.file_bytes + 4096
    if first and k.agent_fault == "file_bytes_mismatch":
        declared = size + 1
    spec = FileSpec(
        a.run_id, call.name, call.round, index, a.turn, size, k.file_mime, a.ctx.created, declared
    )
    return _event("file_produced", file_event_data(spec))


def _content(ctx: Ctx, r: int, count: int) -> Iterator[bytes | Pause]:
    for i in range(count):
        if ctx.knobs.delay_ms:
            yield Pause(ctx.knobs.delay_ms / 1000)
        yield sse_chunk(make_chunk(ctx, f"sim-round-{r}-token-{i} ", None, None))


def _decide(a: Agentic, call: ToolCall, wire_round: int) -> Generator[Any, None, Decision | None]:
    """The round's decision (None: the stream ended inside the round, a fault)."""
    k, r = a.ctx.knobs, call.round
    fault = k.agent_fault if r == 0 else None
    if a.permission == "deny":
        decision = Decision(False, message=f"{call.label} was denied by policy.", by="policy")
    elif a.permission == "auto":
        decision = Decision(True, by="auto")
    else:
        approval_id = a.approval_id(_APPROVAL_KIND + r)
        announce = Announce(approval_id, a.session_id)
        yield announce
        if announce.remembered:
            decision = Decision(True, by="remembered")
        else:
            shown = a.approval_id(_STALE_KIND) if fault == "stale_approval" else approval_id
            yield _approval(a, shown, call, wire_round)
            if fault == "two_approvals":
                yield _approval(a, a.approval_id(_SECOND_KIND), call, wire_round)
            if fault in ("end_in_round", "done_in_round"):
                return None
            if k.approval_delay_ms:
                yield Pause(k.approval_delay_ms / 1000)
            wait = AwaitDecision(approval_id, a.session_id, k.approval_timeout_s)
            yield wait
            assert wait.decision is not None  # the core answers before resuming the plan
            decision = wait.decision
    return None if fault in ("end_in_round", "done_in_round") else decision


def _outcome(decision: Decision) -> str:
    if decision.by in ("auto", "policy", "timeout", "remembered"):
        return decision.by
    return "approved" if decision.approve else "denied"


def _round(a: Agentic, call: ToolCall, ctx: Ctx) -> Generator[Any, None, bool]:
    """One round's events after its content; False if the stream ended in it."""
    k, r = a.ctx.knobs, call.round
    fault = k.agent_fault if r == 0 else None
    wire_round = r
    if k.agent_fault == "round_regress" and r == 1:
        wire_round = 0
    if k.agent_fault == "round_over_max" and r == a.executed - 1:
        wire_round = a.max_rounds
    if fault != "complete_without_calling":
        yield _progress(call, wire_round, "calling", call.calling())
    if fault == "unknown_event":
        yield UNKNOWN_EVENT
    if fault == "content_in_round":
        yield sse_chunk(make_chunk(ctx, f"sim-round-{r}-inside ", None, None))
    decision = yield from _decide(a, call, wire_round)
    if decision is None:
        if fault == "done_in_round":
            yield DONE_EVENT
        yield Op.END
        return False
    message = None if decision.approve else decision.message or "Agent action was denied."
    approval = (
        a.approval_id(_APPROVAL_KIND + r) if decision.by in ("caller", "early", "timeout") else None
    )
    yield RoundDone(r, call.name, call.kind, approval, _outcome(decision), message)
    if decision.approve and call.files_ok:
        for index in range(k.files):
            yield _file(a, call, index)
    ran = decision.approve or fault == "ran_after_deny"
    data = call.result(a.allowed_domains) if ran else call.denied(message or "")
    yield _progress(call, wire_round, "complete", data)
    if fault == "file_outside_round":
        yield _file(a, call, k.files)
    return True


def _spent(a: Agentic) -> Spent:
    k, spent = a.ctx.knobs, Spent()
    for r in range(a.executed):
        prompt, completion = a.ctx.prompt_tokens + PROMPT_PER_ROUND * r, k.round_chunks + 1
        spent = spent.add(prompt, completion, seconds(k, prompt, completion))
    return spent


def _answer_ctx(a: Agentic) -> Ctx:
    n = a.executed
    return dataclasses.replace(
        a.ctx,
        number=a.ctx.number + n,
        prompt_tokens=a.ctx.prompt_tokens + PROMPT_PER_ROUND * n,
        session_id=a.session_id,
        spent=_spent(a),
    )


def _stream(a: Agentic) -> SseBody:
    k = a.ctx.knobs
    if k.agent_fault == "approval_outside_round":
        yield _approval(a, a.approval_id(_OUTSIDE_KIND), tool_call(a.plan[0], 0), 0)
    for r in range(a.executed):
        call = tool_call(a.plan[r], r)
        ctx = dataclasses.replace(a.ctx, number=a.ctx.number + r)
        yield from _content(ctx, r, k.round_chunks)
        if not (yield from _round(a, call, ctx)):
            return
    yield SaveSession(a.session_id, a.messages)
    answer = _answer_ctx(a)
    if k.agent_fault == "unknown_event" and a.executed == 0:
        yield UNKNOWN_EVENT
    if len(a.plan) > a.max_rounds:
        # one call over the cap: the worker forwards nothing more and drops the channel
        yield from _content(
            dataclasses.replace(answer, session_id=None), a.executed, k.round_chunks
        )
        yield Op.END
        return
    yield from stream_body(answer)


# ------------------------------------------------------------- not streamed


def _arguments(data: dict[str, Any], call: ToolCall) -> str:
    """``extract_arguments``: the record's arguments, from the calling data."""
    kind = data["tool_type"]
    if kind == "code_execution":
        return orjson.dumps({"code": data["code"]}).decode()
    if kind == "web_search":
        return orjson.dumps({"query": data["query"]}).decode() if "query" in data else ""
    if kind == "shell":
        return orjson.dumps({"commands": data["commands"]}).decode()
    return call.arguments


def _result_content(data: dict[str, Any]) -> str:
    """``record_agentic_progress``: the record's result, from the complete data."""
    kind = data["tool_type"]
    if kind == "code_execution":
        parts = [f"{key}: {data[key]}" for key in ("stdout", "stderr", "exception") if key in data]
        return "\n".join(parts)
    if kind == "web_search":
        parts = [f"{data['results_count']} results"] if "results_count" in data else []
        if data.get("sources"):
            parts.append("sources: " + ", ".join(data["sources"]))
        return "\n".join(parts)
    if kind == "shell":
        keys = ("stdout", "stderr", "exit_code", "status", "working_directory", "timed_out")
        return orjson.dumps({key: data[key] for key in keys if key in data}).decode()
    content: str = data.get("content", "")
    return content


def _records(a: Agentic) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[RoundDone]]:
    """(agentic_tool_calls, files, notes) of a run played without events (auto or deny)."""
    k = a.ctx.knobs
    records: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    notes: list[RoundDone] = []
    for r in range(a.executed):
        call = tool_call(a.plan[r], r)
        approve = a.permission == "auto"
        message = None if approve else f"{call.label} was denied by policy."
        notes.append(
            RoundDone(r, call.name, call.kind, None, "auto" if approve else "policy", message)
        )
        data = call.result(a.allowed_domains) if approve else call.denied(message or "")
        record: dict[str, Any] = {"round": r, "name": call.name}
        record.update(
            arguments=_arguments(call.calling(), call), result_content=_result_content(data)
        )
        if approve and call.files_ok and k.files:
            made = [
                file_event_data(
                    FileSpec(
                        a.run_id, call.name, r, i, a.turn, k.file_bytes, k.file_mime, a.ctx.created
                    )
                )
                for i in range(k.files)
            ]
            record["file_ids"] = [f["id"] for f in made]
            files.extend(made)
        records.append(record)
    return records, files[:64], notes


def plan_agentic(a: Agentic) -> Iterator[PlanStep]:
    """The whole reply to an agentic chat request (the envelope's faults included)."""
    k = a.ctx.knobs
    plan = tuple(e.kind if e.arg is None else f"{e.kind}:{e.arg}" for e in a.plan)
    yield RunStart(a.session_id, a.requested_session_id, a.permission, a.max_rounds, plan)
    answer = _answer_ctx(a)
    if len(a.plan) > a.max_rounds:  # not streamed, the over-cap call ends the answer
        answer = dataclasses.replace(answer, knobs=dataclasses.replace(k, tool_call=True))
    records: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    if not a.ctx.stream:
        records, files, notes = _records(a)
        yield from notes
        yield SaveSession(a.session_id, a.messages)

    def json_body() -> bytes:
        body = json_dict(answer)
        if records:
            body["agentic_tool_calls"] = records
        if files:
            body["files"] = files
        body["session_id"] = a.session_id
        return json_bytes(answer, body)

    def sse_body() -> SseBody:
        return _stream(a)

    rounds_s = a.executed * k.round_chunks * k.delay_ms / 1000
    delay = total_delay(answer) + rounds_s
    yield from envelope(Envelope(a.ctx.stream, k, a.ctx.request_id, delay, json_body, sse_body))
