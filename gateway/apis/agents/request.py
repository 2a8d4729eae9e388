"""What the request rewrite reads beyond the body, and what it returns (spec §22). Pure.

:class:`AgentContext` is the planner's: the tenant, its policy's ``agents``,
the ``agents`` of the worker serving the route, the session key and whether
the caller takes agent events. :class:`AgentRequest` is one agentic request:
what the caller asked for (the tools, its session id to echo), what the
dialect's allowlist must not see (:meth:`AgentRequest.strip`), and what the
worker's chat request gets (:meth:`AgentRequest.apply`); its ``rounds`` are
the event machine's ``max_tool_rounds`` and the reservation's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.apis.agents.options import CODE_TOOL
from gateway.apis.agents.session import fresh_session_id
from gateway.config.agents import PolicyAgents, RouteAgents

__all__ = ["AgentContext", "AgentRequest"]


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What the rewrite may know beyond the body."""

    tenant: str
    policy: PolicyAgents | None
    #: the ``agents`` of the worker serving the request's route
    route: RouteAgents | None
    #: gateway ``agents.session_key_env``'s value
    session_key: bytes
    #: the caller streams and sent ``x-agent-events: 1``
    agent_events: bool = False
    fresh_session: Callable[[], str] = fresh_session_id


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """An agentic request: what the caller asked for and what the worker gets."""

    #: the policy tools asked for (``web_search``, ``python``)
    tools: frozenset[str]
    #: the forwarded (clamped) max_tool_rounds: the event machine's and the reservation's
    rounds: int
    worker_session_id: str
    #: the caller's own id, echoed to it (None: it sent none and gets none back)
    caller_session_id: str | None
    web_search_options: Mapping[str, Any] | None
    #: top-level fields taken out of the caller's body
    consumed: frozenset[str]
    #: indexes of the caller's ``tools`` entries taken out (server tools)
    consumed_tools: frozenset[int] = frozenset()

    def forwarded(self) -> dict[str, Any]:
        """The agentic fields of the worker's chat request."""
        out: dict[str, Any] = {
            "agent_permission": "ask",
            "stream": True,
            "max_tool_rounds": self.rounds,
            "session_id": self.worker_session_id,
        }
        if self.web_search_options is not None:
            out["web_search_options"] = dict(self.web_search_options)
        return out

    def strip(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The caller's body without what this rewrite took (for the allowlist)."""
        out = {k: v for k, v in body.items() if k not in self.consumed}
        if self.consumed_tools:
            kept = [t for i, t in enumerate(body["tools"]) if i not in self.consumed_tools]
            if kept:
                out["tools"] = kept
            else:
                del out["tools"]
        return out

    def apply(self, worker_body: Mapping[str, Any]) -> dict[str, Any]:
        """The worker's chat request with the agentic fields set."""
        out = dict(worker_body)
        out.pop("code_execution_permission", None)
        out.update(self.forwarded())
        if "python" in self.tools:
            tools = list(out.get("tools") or [])
            if CODE_TOOL not in tools:
                tools.append({"type": "code_interpreter", "container": {"type": "auto"}})
            out["tools"] = tools
        return out
