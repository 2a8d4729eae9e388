"""The agentic part of a ``/v1/chat/completions`` body, read as the worker reads
it (``openai.rs`` ``ChatCompletionRequest``, ``chat_completion.rs``). Pure.

A request is agentic (the engine runs its tool loop) when it has
``web_search_options`` (even ``{}``), a ``{"type": "code_interpreter", ...}``
tool, ``max_tool_rounds``, or ``enable_shell: true``; with an MCP config the
worker would run every request so, which the simulator does not model.

Shape errors are axum's 422 text: ``agent_permission`` /
``code_execution_permission`` not ``auto|ask|deny``, ``max_tool_rounds`` not
a usize, ``session_id`` not a string, ``enable_shell`` not a boolean,
``web_search_options`` not an object, a ``code_interpreter`` tool without
``container``. ``parse_request``'s refusals are 500 ``{"message"}``: a
container id string, ``container.memory_limit``, non-empty
``container.file_ids``, and ``web_search`` / ``shell`` tool types (Responses
only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.knobs import PERMISSIONS
from gateway.testing.simulator.plans import Reject

DEFAULT_MAX_TOOL_ROUNDS = 256
_CODE = 'tools[].type="code_interpreter"'


@dataclass(frozen=True, slots=True)
class AgentRequest:
    permission: str | None  # the request's own (code_execution_permission folded in)
    max_tool_rounds: int | None
    session_id: str | None
    web: bool
    python: bool
    shell: bool
    allowed_domains: tuple[str, ...]
    messages: tuple[tuple[str, str], ...]  # (role, text): how sessions are matched
    turn: int  # user messages - 1


def _permission(req: dict[str, Any], key: str) -> str | None:
    value = req.get(key)
    if value is not None and value not in PERMISSIONS:
        raise Reject.shape(
            f"{key}: unknown variant `{value}`, expected one of `auto`, `ask`, `deny`"
        )
    return value


def _code_interpreter(tools: Any) -> bool:
    if not isinstance(tools, list):
        return False
    found = False
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in ("web_search", "web_search_preview"):
            raise Reject.handler(
                500,
                'tools[].type="web_search" is only supported by the Responses API; '
                "use web_search_options with Chat Completions",
            )
        if kind == "shell":
            raise Reject.handler(
                500, 'tools[].type="shell" is only supported by the Responses API.'
            )
        if kind != "code_interpreter" or not isinstance(tool, dict):
            continue
        container = tool.get("container")
        if isinstance(container, str):
            raise Reject.handler(500, f"{_CODE} container IDs are not supported.")
        if not isinstance(container, dict) or container.get("type") != "auto":
            raise Reject.shape("tools: missing field `container` or container.type not `auto`")
        if container.get("memory_limit") is not None:
            raise Reject.handler(500, f"{_CODE} container.memory_limit is not supported.")
        if container.get("file_ids"):
            raise Reject.handler(500, f"{_CODE} container.file_ids is not supported.")
        found = True
    return found


def _domains(options: dict[str, Any]) -> tuple[str, ...]:
    filters = options.get("filters")
    allowed = filters.get("allowed_domains") if isinstance(filters, dict) else None
    if not isinstance(allowed, list):
        return ()
    return tuple(d for d in allowed if isinstance(d, str))


def parse_agentic(req: dict[str, Any], messages: list[tuple[str, str]]) -> AgentRequest | None:
    """The request's agentic fields; None when the worker would not run it agentically."""
    permission = _permission(req, "agent_permission") or _permission(
        req, "code_execution_permission"
    )
    rounds = req.get("max_tool_rounds")
    if rounds is not None and (
        isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0
    ):
        raise Reject.shape("max_tool_rounds: invalid type, expected usize")
    session_id = req.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        raise Reject.shape("session_id: invalid type, expected a string")
    shell = req.get("enable_shell")
    if shell is not None and not isinstance(shell, bool):
        raise Reject.shape("enable_shell: invalid type, expected a boolean")
    options = req.get("web_search_options")
    if options is not None and not isinstance(options, dict):
        raise Reject.shape("web_search_options: invalid type, expected struct WebSearchOptions")
    python = _code_interpreter(req.get("tools"))
    if options is None and not python and rounds is None and not shell:
        return None
    users = sum(1 for role, _ in messages if role == "user")
    return AgentRequest(
        permission=permission,
        max_tool_rounds=rounds,
        session_id=session_id,
        web=options is not None,
        python=python,
        shell=bool(shell),
        allowed_domains=_domains(options or {}),
        messages=tuple(messages),
        turn=max(0, users - 1),
    )


def strictest(server: str, request: str | None) -> str:
    """The worker's ``AgentPermission::strictest``: deny > ask > auto."""
    order = ("auto", "ask", "deny")
    return max(server, request or "auto", key=order.index)
