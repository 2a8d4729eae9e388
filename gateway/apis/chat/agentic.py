"""An agentic chat stream (spec §22): the chunk grammar and the agentic events, one source. Pure.

The worker's chat stream of an agentic request carries named events between
its chunks. :class:`AgentChunkValidator` reads both under one framing (its
line and event bounds grown for ``file_produced``, spec §24): unnamed events
go to the chunk grammar, named ones to the request's
:class:`~gateway.apis.agents.events.AgentEvents` (``AgentStream``), and an end
inside a tool round is reported as the machine's protocol error rather than
the framing's "closed early".

:class:`AgentDialect` wraps the endpoint's own dialect (chat, or Anthropic
Messages, which reads chat chunks too): chunks go to it -- the worker's
session id in the last chunk replaced by the caller's own, or removed -- and
the tool rounds become ``event: agent.tool_call`` frames for callers that
asked (``x-agent-events: 1``). Approvals and files are never framed here:
they need I/O (the decision, the file store), which the pipeline's agent run
does before the next event is read (``gateway/pipeline/agents.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from gateway.apis.agents.events import AgentEvent, AgentEvents, line_bound
from gateway.apis.agents.frames import tool_call_frame
from gateway.apis.agents.request import AgentContext, AgentRequest
from gateway.apis.agents.stream import AgentStream
from gateway.apis.agents.wire import ToolCalling, ToolComplete
from gateway.apis.base import Dialect, OneCall, Plan, PlanContext, Report, Source, resolve_alias
from gateway.apis.chat.grammar import Chunk, ChunkGrammar, StreamRules
from gateway.core.errors import GatewayError
from gateway.core.sse import StreamValidator

__all__ = [
    "AgentChunkValidator",
    "AgentDialect",
    "ChunkSource",
    "agent_events_asked",
    "agent_source",
    "plan_agent",
]

Rewrite = Callable[[Mapping[str, Any], AgentContext], AgentRequest | None]


def plan_agent(body: dict[str, Any], ctx: PlanContext, rewrite: Rewrite) -> AgentRequest | None:
    """The request's agentic part (spec §22), read before the dialect's allowlist:
    what the tenant's policy and the alias's route allow, the caller's wish for
    agent events (a stream with ``x-agent-events: 1``)."""
    policy = ctx.tenant.policy.agents
    if policy is None:
        # Without agents the dialect's allowlist refuses every agentic field, as before.
        return None
    # A model the tenant cannot name is that error first, as without agents.
    route = ctx.route_agents(ctx.aliases[resolve_alias(body, ctx)])
    events = agent_events_asked(body, ctx)
    context = AgentContext(ctx.tenant.name, policy, route, ctx.session_key, agent_events=events)
    return rewrite(body, context)


def agent_events_asked(body: dict[str, Any], ctx: PlanContext) -> bool:
    return body.get("stream") is True and ctx.header(b"x-agent-events") == b"1"


class ChunkSource(Source, Protocol):
    """A chat stream's source with its chunk grammar (what the chat dialect reads)."""

    @property
    def chunks(self) -> ChunkGrammar: ...


def _is_final(chunk: Chunk) -> bool:
    return chunk.finish_reason is not None


class _AgentChat(AgentStream[Chunk]):
    """Chunks and agentic events; each tool round ends a model turn, whose
    chunks had their own id (the worker's agentic loop starts a new one)."""

    inner: ChunkGrammar

    def on_event(self, name: str | None, data: str) -> Chunk | AgentEvent | None:
        item = super().on_event(name, data)
        if isinstance(item, ToolComplete):
            self.inner.new_turn()
        return item


class AgentChunkValidator(StreamValidator[Chunk | AgentEvent]):
    """Chat chunks and agentic events under one WHATWG framing."""

    def __init__(self, rules: StreamRules, machine: AgentEvents) -> None:
        bound = line_bound(rules.max_line_bytes, machine.limits.files_max_bytes)
        rules = dataclasses.replace(
            rules, max_line_bytes=bound, max_event_bytes=max(rules.max_event_bytes, bound)
        )
        self.chunks = ChunkGrammar(rules)
        self.machine = machine
        self._agent_chat = _AgentChat(self.chunks, machine, _is_final)
        super().__init__(rules.framing, self._agent_chat)

    @property
    def grammar(self) -> _AgentChat:
        return self._agent_chat

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except GatewayError as exc:
            if exc.code != "upstream_unavailable":
                raise
            # The framing's EOF: a protocol error when it fell inside a round.
            error = self.grammar.eof(exc)
        # Raised outside the handler, so with no context (``from None`` would
        # do in Python, but not in the compiled build).
        self._error = error
        raise error.with_traceback(None)


def agent_source(rules: StreamRules, machine: AgentEvents) -> AgentChunkValidator:
    return AgentChunkValidator(rules, machine)


class AgentDialect(OneCall):
    """The endpoint's dialect with the agentic events beside it; see the module docstring."""

    def __init__(self, inner: Dialect, plan: Plan, *, collect: bool) -> None:
        self.inner = inner
        agent = plan.agent
        self.caller_session = agent.caller_session_id if agent is not None else None
        #: tool rounds as frames: only a streaming caller that asked for them
        self.events = plan.agent_events and not collect
        self.usage_source = inner.usage_source

    @property
    def source(self) -> Source:
        return self.inner.source

    @property
    def has_content(self) -> bool:
        return self.inner.has_content

    @property
    def terminal_frame(self) -> bytes:
        return self.inner.terminal_frame

    def on_item(self, item: Any) -> bytes | None:
        if isinstance(item, Chunk):
            # A plain chunk is its template with another text (grammar.py):
            # without a session id there, its data is not parsed (reading it
            # would also cost the chunk its spliced frame).
            template = item.template
            if template is None or "session_id" in template:
                data = item.data
                if "session_id" in data:
                    # The worker's session id is the gateway's (spec §22): the caller's back.
                    if self.caller_session is None:
                        del data["session_id"]
                    else:
                        data["session_id"] = self.caller_session
            return self.inner.on_item(item)
        if not self.events:
            return None
        if isinstance(item, ToolCalling):
            return tool_call_frame(item.round, item.tool_name, "calling")
        if isinstance(item, ToolComplete):
            sources = item.sources if item.tool_type == "web_search" else None
            decision: Literal["approve", "deny"] = "deny" if item.denied else "approve"
            return tool_call_frame(item.round, item.tool_name, "complete", decision, sources)
        return None  # approvals and files: the pipeline's agent run frames them

    def error_frame(self, exc: GatewayError) -> bytes:
        return self.inner.error_frame(exc)

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        answer = self.inner.answer(usage)
        assert isinstance(answer, dict)  # chat and Messages answer JSON
        answer.pop("session_id", None)
        if self.caller_session is not None:
            answer["session_id"] = self.caller_session
        return answer

    def report(self) -> Report:
        return self.inner.report()
