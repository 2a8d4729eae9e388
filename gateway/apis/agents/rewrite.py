"""The request side of agents: what a caller may ask for, and what the worker
gets instead (spec §22 "Requests", §24). Pure.

:func:`rewrite_chat` and :func:`rewrite_messages` read the caller's body
(never changing it) before the dialect's allowlist, and return ``None`` for a
request with no agentic field, else an :class:`AgentRequest`: what to take
out of the body before the allowlist (:meth:`AgentRequest.strip`) and what
to set on the worker's chat request (:meth:`AgentRequest.apply`; Messages
are forwarded to the worker as chat completions, so their server tools
become chat fields).

Rules, field by field in body order (the first breach is raised):

* a tenant without policy ``agents``: every agentic field is
  ``unsupported_field`` with the message and ``param`` the dialect's
  allowlist gives today (a non-function chat tool, a Messages server tool:
  ``param`` ``tools[i].type``);
* what a tenant with ``agents`` may send -- chat ``web_search_options`` and
  the ``code_interpreter`` tool; Messages ``web_search_*`` /
  ``code_execution_*`` server tools and ``enable_code_execution``; both
  ``max_tool_rounds`` and ``session_id`` -- each tool needing its policy
  tool (else 403 ``tool_not_allowed``, ``param`` the field path such as
  ``web_search_options`` or ``tools[2]``), then its route to run it (else
  400 ``model_not_capable``: a route without ``agents`` runs its tools
  without asking, so nothing agentic is ever forwarded to it);
* never forwarded (``unsupported_field``): ``search_description``,
  ``extract_description``, ``enable_shell``, shell tools, ``files``,
  ``tool_dispatch_url``, ``remember_for_session`` (and on Messages, as
  today, ``web_search_options``, ``container``, ``mcp_servers``);
* ``agent_permission`` / ``code_execution_permission`` are read and ignored;
* a client function tool named like an MCP tool of the route
  (``<prefix>_…``) is ``invalid_request``: the worker would take it for its
  own (and without a callback a stream ends inside a round);
* an explicit ``null`` is the field's absence (§24);
* with ``approval: caller`` the caller must stream with agent events
  (``x-agent-events: 1``), else 400 ``approval_requires_events``.

Forwarded: ``agent_permission: "ask"``, ``stream: true``,
``max_tool_rounds`` = min(caller's, policy's, route's, a Messages web tool's
``max_uses``), ``web_search_options.filters.allowed_domains`` = the caller's
∩ the policy's (``options.py``), the code tool when Python was asked for, and
``session_id`` = the HMAC of the caller's (``session.py``) or a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.apis.agents import options
from gateway.apis.agents.request import AgentContext, AgentRequest
from gateway.apis.agents.session import worker_session_id
from gateway.apis.fields import boolean, child, enum, integer, invalid, item, unsupported
from gateway.core.errors import GatewayError

__all__ = ["rewrite_chat", "rewrite_messages"]

Dialect = Literal["chat", "messages"]
_AGENTIC = "is not supported (agentic and server-side tool features are not served)"
_NEVER = "is never forwarded"
_SHELL = "is not supported (shell tools are never served)"
#: what today's allowlists refuse as agentic, per dialect (spec §12, §19)
_TODAY: dict[Dialect, frozenset[str]] = {
    "chat": frozenset(
        (
            "web_search_options",
            "max_tool_rounds",
            "enable_shell",
            "agent_permission",
            "code_execution_permission",
            "session_id",
            "files",
        )
    ),
    "messages": frozenset(
        (
            "container",
            "mcp_servers",
            "session_id",
            "web_search_options",
            "enable_code_execution",
            "agent_permission",
            "code_execution_permission",
            "files",
            "max_tool_rounds",
        )
    ),
}
_ALWAYS_REFUSED: dict[Dialect, frozenset[str]] = {
    "chat": frozenset(("enable_shell", "files", "tool_dispatch_url", "remember_for_session")),
    "messages": frozenset(
        (
            "enable_shell",
            "files",
            "tool_dispatch_url",
            "remember_for_session",
            "web_search_options",
            "container",
            "mcp_servers",
        )
    ),
}
_PERMISSION = enum("auto", "ask", "deny")
_ROUNDS = integer(ge=1)
_MAX_SESSION_CHARS = 256


def rewrite_chat(body: Mapping[str, Any], ctx: AgentContext) -> AgentRequest | None:
    return _Rewrite(ctx, "chat").run(body)


def rewrite_messages(body: Mapping[str, Any], ctx: AgentContext) -> AgentRequest | None:
    return _Rewrite(ctx, "messages").run(body)


@dataclass
class _Rewrite:
    ctx: AgentContext
    dialect: Dialect
    tools: dict[str, str] = field(default_factory=dict)
    consumed: list[str] = field(default_factory=list)
    consumed_tools: list[int] = field(default_factory=list)
    rounds: int | None = None
    max_uses: int | None = None
    session: str | None = None
    web: dict[str, Any] | None = None

    def run(self, body: Mapping[str, Any]) -> AgentRequest | None:
        for name, value in body.items():
            if not isinstance(name, str):
                continue
            if name == "tools" and isinstance(value, list):
                for index, tool in enumerate(value):
                    self._tool(index, tool)
            else:
                self._field(name, value)
        if not (self.consumed or self.consumed_tools):
            return None
        return self._result()

    # -- top-level fields ------------------------------------------------------

    def _field(self, name: str, value: Any) -> None:
        policy = self.ctx.policy
        if policy is None:
            if name in _TODAY[self.dialect]:
                raise unsupported(name, _AGENTIC)
            return
        if value is None:
            return  # §24: an explicit null is the field's absence
        if name in _ALWAYS_REFUSED[self.dialect]:
            raise unsupported(name, _AGENTIC if name in _TODAY[self.dialect] else _NEVER)
        handler = _FIELDS[self.dialect].get(name)
        if handler is not None:
            self.consumed.append(name)
            handler(self, value, name)

    def _web_search_options(self, value: Any, path: str) -> None:
        checked = options.WEB_OPTIONS(value, path)
        self._need("web_search", path)
        self.web = checked

    def _enable_code_execution(self, value: Any, path: str) -> None:
        if boolean(value, path):
            self._need("python", path)

    def _max_tool_rounds(self, value: Any, path: str) -> None:
        self.rounds = _ROUNDS(value, path)
        self._route(path)

    def _session_id(self, value: Any, path: str) -> None:
        if not isinstance(value, str) or not 1 <= len(value) <= _MAX_SESSION_CHARS:
            raise invalid(path, "must be a string of 1 to 256 characters")
        self.session = value
        self._route(path)

    def _permission(self, value: Any, path: str) -> None:
        _PERMISSION(value, path)  # read, then ignored: the gateway always asks
        self._route(path)

    # -- tools -------------------------------------------------------------------

    def _tool(self, index: int, tool: Any) -> None:
        if not isinstance(tool, dict):
            return  # the allowlist's to refuse
        path = item("tools", index)
        kind = tool.get("type")
        client = kind == "function" if self.dialect == "chat" else kind in (None, "custom")
        if client:
            self._client_tool(tool, path)
            return
        if self.ctx.policy is None:
            only = "function tools are" if self.dialect == "chat" else "client tools are"
            raise unsupported(child(path, "type"), f"is not supported (only {only})")
        kind = kind if isinstance(kind, str) else ""
        if self.dialect == "chat" and kind == "code_interpreter":
            options.CODE_TOOL_SPEC(tool, path)
            self._need("python", path)
        elif self.dialect == "messages" and kind.startswith("web_search_"):
            self._web_server_tool(tool, path, kind)
        elif self.dialect == "messages" and kind.startswith("code_execution_"):
            options.CODE_SERVER_TOOL(tool, path)
            self._need("python", path)
        elif kind == "shell" or kind.startswith("bash_"):
            raise unsupported(child(path, "type"), _SHELL)
        else:
            served = (
                "function and code_interpreter tools are"
                if self.dialect == "chat"
                else "client tools and web search and code execution server tools are"
            )
            raise unsupported(child(path, "type"), f"is not supported (only {served})")
        self.consumed_tools.append(index)

    def _web_server_tool(self, tool: dict[str, Any], path: str, kind: str) -> None:
        checked = options.WEB_SERVER_TOOL(tool, path)
        if self.web is not None:
            raise invalid(path, "is a second web search tool")
        self._need("web_search", path)
        if kind == "web_search_20260209":
            # The dynamic variant filters results with code: the worker turns code on.
            self._need("python", path)
        self.web = options.messages_web_options(checked)
        self.max_uses = checked.get("max_uses")

    def _client_tool(self, tool: dict[str, Any], path: str) -> None:
        route = self.ctx.route
        if self.ctx.policy is None or route is None or not route.mcp_prefixes:
            return
        if self.dialect == "chat":
            function = tool.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            where = child(child(path, "function"), "name")
        else:
            name, where = tool.get("name"), child(path, "name")
        if isinstance(name, str) and any(name.startswith(f"{p}_") for p in route.mcp_prefixes):
            raise invalid(where, "names a tool of the worker's MCP servers")

    # -- the policy and the route -------------------------------------------------

    def _need(self, tool: str, path: str) -> None:
        policy = self.ctx.policy
        assert policy is not None
        if tool not in policy.tools:
            raise GatewayError(
                "tool_not_allowed", f"Tool {tool} is not allowed for this tenant.", param=path
            )
        route = self.ctx.route
        if route is None or not (route.web_search if tool == "web_search" else route.python):
            raise GatewayError("model_not_capable", f"This model does not run {tool}.", param=path)
        self.tools.setdefault(tool, path)

    def _route(self, path: str) -> None:
        if self.ctx.route is None:
            raise GatewayError("model_not_capable", "This model runs no tools.", param=path)

    def _result(self) -> AgentRequest:
        policy, route = self.ctx.policy, self.ctx.route
        assert policy is not None
        self._route(self.consumed[0] if self.consumed else item("tools", self.consumed_tools[0]))
        assert route is not None
        if policy.approval == "caller" and not self.ctx.agent_events:
            raise GatewayError("approval_requires_events")
        bounds = [policy.max_tool_rounds, route.max_tool_rounds, self.rounds, self.max_uses]
        rounds = min(b for b in bounds if b is not None)
        web = None
        if self.web is not None and policy.web is not None:
            web = dict(self.web)
            filters = dict(web.get("filters") or {})
            caller = filters.get("allowed_domains")
            filters["allowed_domains"] = options.allowed_domains(caller, policy.web.allowed_domains)
            web["filters"] = filters
        key, tenant = self.ctx.session_key, self.ctx.tenant
        worker = (
            worker_session_id(key, tenant, self.session)
            if self.session is not None
            else self.ctx.fresh_session()
        )
        return AgentRequest(
            tools=frozenset(self.tools),
            rounds=rounds,
            worker_session_id=worker,
            caller_session_id=self.session,
            web_search_options=web,
            consumed=frozenset(self.consumed),
            consumed_tools=frozenset(self.consumed_tools),
        )


_Handler = Callable[[_Rewrite, Any, str], None]
_COMMON: dict[str, _Handler] = {
    "max_tool_rounds": _Rewrite._max_tool_rounds,
    "session_id": _Rewrite._session_id,
    "agent_permission": _Rewrite._permission,
    "code_execution_permission": _Rewrite._permission,
}
_FIELDS: dict[Dialect, dict[str, _Handler]] = {
    "chat": {**_COMMON, "web_search_options": _Rewrite._web_search_options},
    "messages": {**_COMMON, "enable_code_execution": _Rewrite._enable_code_execution},
}
