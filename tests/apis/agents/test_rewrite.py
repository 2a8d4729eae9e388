"""The request side of agents (spec §22 "Requests", §24) on realistic chat and
Messages bodies: what is refused, what is taken out before the dialect's
allowlist, and what the worker's chat request gets."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.apis.agents import AgentContext, AgentRequest, rewrite_chat, rewrite_messages
from gateway.apis.agents.options import allowed_domains
from gateway.apis.agents.session import worker_session_id
from gateway.apis.base import PlanContext
from gateway.apis.chat.api import ChatApi
from gateway.apis.messages.api import MessagesApi
from gateway.apis.messages.to_chat import chat_body
from gateway.config import LimitsConfig, PolicyAgents, RouteAgents
from gateway.config.policy import Tenant, TenantPolicy, resolve_limits
from gateway.core.errors import GatewayError

KEY = b"k" * 32
ROUTE_ID = "/srv/mosaic-models/" + "0" * 64
POLICY = PolicyAgents.model_validate(
    {
        "tools": ["web_search", "python", "mcp:docs_*"],
        "web": {"allowed_domains": ["docs.example.com", "*.wikipedia.org"]},
        "max_tool_rounds": 8,
    }
)
ROUTE = RouteAgents(
    web_search=True,
    python=True,
    mcp_config="/etc/gw/mcp.json",
    mcp_prefixes=["docs"],
    max_tool_rounds=16,
)
TENANT = Tenant(
    "acme",
    TenantPolicy(tenant="acme", models={"m": ROUTE_ID}, endpoints=["chat.completions", "messages"]),
    resolve_limits(TenantPolicy(tenant="acme").limits, LimitsConfig()),
)
USER = [{"role": "user", "content": "What changed in SSE reconnects? Compute 2+2 too."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CODE = {"type": "code_interpreter", "container": {"type": "auto"}}


def ctx(
    policy: PolicyAgents | None = POLICY, route: RouteAgents | None = ROUTE, **kw: Any
) -> AgentContext:
    return AgentContext("acme", policy, route, KEY, fresh_session=lambda: "gs_" + "f" * 32, **kw)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": copy.deepcopy(USER), **fields}


def messages(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 256, "messages": copy.deepcopy(USER), **fields}


def refusal(run: Any, body: dict[str, Any], context: AgentContext) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        run(body, context)
    return caught.value


# --- chat ----------------------------------------------------------------------------------


def test_a_realistic_chat_request() -> None:
    body = chat(
        stream=False,
        web_search_options={
            "search_context_size": "low",
            "user_location": {"type": "approximate", "approximate": {"city": "Zürich"}},
            "filters": {
                "allowed_domains": ["en.wikipedia.org", "evil.com", "www.docs.example.com"]
            },
        },
        tools=[WEATHER, CODE],
        max_tool_rounds=20,
        session_id="chat-42",
        agent_permission="auto",
    )
    before = copy.deepcopy(body)
    agent = rewrite_chat(body, ctx())
    assert body == before  # the caller's body is read, never changed
    assert agent == AgentRequest(
        tools=frozenset({"web_search", "python"}),
        rounds=8,
        worker_session_id=worker_session_id(KEY, "acme", "chat-42"),
        caller_session_id="chat-42",
        web_search_options={
            "search_context_size": "low",
            "user_location": {"type": "approximate", "approximate": {"city": "Zürich"}},
            "filters": {"allowed_domains": ["en.wikipedia.org", "docs.example.com"]},
        },
        consumed=frozenset(
            {"web_search_options", "max_tool_rounds", "session_id", "agent_permission"}
        ),
        consumed_tools=frozenset({1}),
    )
    # What is left passes today's allowlist; the worker's request gets the agentic fields.
    stripped = agent.strip(body)
    assert stripped["tools"] == [WEATHER] and "session_id" not in stripped
    api = ChatApi()
    plan = api.plan(stripped, PlanContext(TENANT, "n"))
    worker = agent.apply(api.forward(plan, ROUTE_ID))
    assert worker["tools"] == [WEATHER, CODE]
    assert (worker["stream"], worker["agent_permission"], worker["max_tool_rounds"]) == (
        True,
        "ask",
        8,
    )
    assert worker["session_id"] == agent.worker_session_id != "chat-42"
    assert worker["web_search_options"]["filters"]["allowed_domains"] == [
        "en.wikipedia.org",
        "docs.example.com",
    ]
    assert "code_execution_permission" not in worker and "remember_for_session" not in worker


def test_a_plain_request_is_not_agentic() -> None:
    assert rewrite_chat(chat(tools=[WEATHER], stream=True), ctx()) is None
    assert rewrite_messages(messages(), ctx()) is None


def test_rounds_are_clamped_and_sessions_fresh_when_none_was_sent() -> None:
    agent = rewrite_chat(chat(tools=[CODE], max_tool_rounds=3), ctx())
    assert agent is not None and agent.rounds == 3
    agent = rewrite_chat(chat(tools=[CODE]), ctx())
    assert agent is not None and agent.rounds == 8
    assert (agent.caller_session_id, agent.worker_session_id) == (None, "gs_" + "f" * 32)
    low = RouteAgents(python=True, max_tool_rounds=4)
    agent = rewrite_chat(chat(tools=[CODE], max_tool_rounds=6), ctx(route=low))
    assert agent is not None and agent.rounds == 4


def test_policy_domains_are_forwarded_when_the_caller_names_none() -> None:
    agent = rewrite_chat(chat(web_search_options={}), ctx())
    assert agent is not None and agent.web_search_options == {
        "filters": {"allowed_domains": ["docs.example.com", "wikipedia.org"]}
    }
    blocked = {"filters": {"blocked_domains": ["de.wikipedia.org"]}}
    agent = rewrite_chat(chat(web_search_options=blocked), ctx())
    assert agent is not None and agent.web_search_options == {
        "filters": {
            "blocked_domains": ["de.wikipedia.org"],
            "allowed_domains": ["docs.example.com", "wikipedia.org"],
        }
    }


@pytest.mark.parametrize(
    ("caller", "forwarded"),
    [
        (["en.wikipedia.org"], ["en.wikipedia.org"]),
        (["wikipedia.org"], ["wikipedia.org"]),  # the worker's reading of *.wikipedia.org
        (["example.com"], ["docs.example.com"]),  # the policy's name is the narrower
        (["docs.example.com", "docs.example.com"], ["docs.example.com"]),
        (["a.docs.example.com"], []),
        (["evil.com", "org"], ["wikipedia.org"]),
        ([], []),
    ],
)
def test_allowed_domains_are_the_intersection(caller: list[str], forwarded: list[str]) -> None:
    assert allowed_domains(caller, ["docs.example.com", "*.wikipedia.org"]) == forwarded


def test_null_fields_are_absent() -> None:
    assert rewrite_chat(chat(web_search_options=None, session_id=None), ctx()) is None
    agent = rewrite_chat(chat(tools=[CODE], session_id=None, files=None), ctx())
    assert agent is not None and agent.caller_session_id is None


# --- refusals --------------------------------------------------------------------------------


def test_a_tool_outside_the_policy_is_tool_not_allowed_naming_its_field() -> None:
    python_only = PolicyAgents(tools=["python"])
    error = refusal(rewrite_chat, chat(web_search_options={}), ctx(python_only))
    assert (error.code, error.status, error.param) == (
        "tool_not_allowed",
        403,
        "web_search_options",
    )
    web_only = PolicyAgents.model_validate(
        {"tools": ["web_search"], "web": {"allowed_domains": ["docs.example.com"]}}
    )
    error = refusal(rewrite_chat, chat(tools=[WEATHER, WEATHER, CODE]), ctx(web_only))
    assert (error.code, error.param) == ("tool_not_allowed", "tools[2]")


def test_a_route_that_does_not_run_the_tool_is_model_not_capable() -> None:
    error = refusal(rewrite_chat, chat(web_search_options={}), ctx(route=RouteAgents(python=True)))
    assert (error.code, error.status, error.param) == (
        "model_not_capable",
        400,
        "web_search_options",
    )
    # A route without agents runs tools without asking: nothing agentic goes to it.
    for body in (chat(tools=[CODE]), chat(session_id="s"), chat(max_tool_rounds=2)):
        assert refusal(rewrite_chat, body, ctx(route=None)).code == "model_not_capable"
    error = refusal(rewrite_messages, messages(enable_code_execution=False), ctx(route=None))
    assert (error.code, error.param) == ("model_not_capable", "enable_code_execution")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            chat(web_search_options={"search_description": "x"}),
            "web_search_options.search_description",
        ),
        (
            chat(web_search_options={"extract_description": "x"}),
            "web_search_options.extract_description",
        ),
        (chat(web_search_options={"image_settings": {}}), "web_search_options.image_settings"),
        (chat(web_search_options={"surprise": 1}), "web_search_options.surprise"),
        (chat(enable_shell=True), "enable_shell"),
        (chat(files=[{"name": "out.csv"}]), "files"),
        (chat(tool_dispatch_url="http://10.0.0.1/"), "tool_dispatch_url"),
        (chat(remember_for_session=True), "remember_for_session"),
        (
            chat(tools=[{"type": "shell", "environment": {"type": "container_auto"}}]),
            "tools[0].type",
        ),
        (chat(tools=[WEATHER, {"type": "web_search"}]), "tools[1].type"),
        (
            chat(
                tools=[
                    {
                        "type": "code_interpreter",
                        "container": {"type": "auto", "memory_limit": "4g"},
                    }
                ]
            ),
            "tools[0].container.memory_limit",
        ),
    ],
)
def test_fields_never_forwarded_are_unsupported(body: dict[str, Any], param: str) -> None:
    error = refusal(rewrite_chat, body, ctx())
    assert (error.code, error.param) == ("unsupported_field", param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(max_tool_rounds=0), "max_tool_rounds"),
        (chat(max_tool_rounds=True), "max_tool_rounds"),
        (chat(session_id=""), "session_id"),
        (chat(session_id="x" * 257), "session_id"),
        (chat(agent_permission="always"), "agent_permission"),
        (chat(web_search_options=[]), "web_search_options"),
        (
            chat(web_search_options={"filters": {"allowed_domains": ["10.0.0.1"]}}),
            "web_search_options.filters.allowed_domains[0]",
        ),
        (chat(tools=[{"type": "code_interpreter", "container": "cntr_123"}]), "tools[0].container"),
        (
            chat(tools=[{"type": "function", "function": {"name": "docs_search"}}]),
            "tools[0].function.name",
        ),
    ],
)
def test_malformed_agentic_fields_are_invalid(body: dict[str, Any], param: str) -> None:
    error = refusal(rewrite_chat, body, ctx())
    assert (error.code, error.param) == ("invalid_request", param)


def test_approval_by_the_caller_needs_agent_events() -> None:
    asks = PolicyAgents(tools=["python"], approval="caller")
    error = refusal(rewrite_chat, chat(tools=[CODE]), ctx(asks))
    assert (error.code, error.status) == ("approval_requires_events", 400)
    assert rewrite_chat(chat(tools=[CODE]), ctx(asks, agent_events=True)) is not None


# --- a tenant without agents: today's refusals --------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"web_search_options": {}},
        {"max_tool_rounds": 4},
        {"enable_shell": True},
        {"agent_permission": "ask"},
        {"code_execution_permission": "ask"},
        {"session_id": "s"},
        {"files": []},
        {"tools": [WEATHER, CODE]},
        {"tools": [{"type": "shell"}]},
    ],
)
def test_without_agents_chat_refuses_as_today(extra: dict[str, Any]) -> None:
    body = chat(**extra)
    error = refusal(rewrite_chat, body, ctx(policy=None))
    with pytest.raises(GatewayError) as today:
        ChatApi().plan(body, PlanContext(TENANT, "n"))
    assert (error.code, error.message, error.param) == (
        today.value.code,
        today.value.message,
        today.value.param,
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"web_search_options": {}},
        {"enable_code_execution": True},
        {"session_id": "s"},
        {"max_tool_rounds": 2},
        {"container": {}},
        {"mcp_servers": []},
        {"agent_permission": "ask"},
        {"files": []},
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
        {"tools": [{"type": "bash_20250124", "name": "bash"}]},
    ],
)
def test_without_agents_messages_refuses_as_today(extra: dict[str, Any]) -> None:
    body = messages(**extra)
    error = refusal(rewrite_messages, body, ctx(policy=None))
    with pytest.raises(GatewayError) as today:
        MessagesApi().plan(body, PlanContext(TENANT, "n"))
    assert (error.code, error.message, error.param) == (
        today.value.code,
        today.value.message,
        today.value.param,
    )


def test_without_agents_fields_today_does_not_know_are_left_to_the_allowlist() -> None:
    assert rewrite_chat(chat(tool_dispatch_url="x"), ctx(policy=None)) is None
    assert rewrite_chat(chat(adapter="x"), ctx(policy=None)) is None


# --- Messages ----------------------------------------------------------------------------------


def test_a_realistic_messages_request() -> None:
    body = messages(
        system="You are terse.",
        tools=[
            {
                "type": "web_search_20250305",
                "name": "web_search",
                "max_uses": 3,
                "allowed_domains": ["en.wikipedia.org"],
                "user_location": {"type": "approximate", "city": "Zürich", "country": "CH"},
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "code_execution_20250825", "name": "code_execution"},
            {"name": "get_weather", "input_schema": {"type": "object"}},
        ],
        session_id="claude-session",
        stream=True,
    )
    agent = rewrite_messages(body, ctx())
    assert agent is not None
    assert agent.tools == {"web_search", "python"}
    assert agent.rounds == 3  # max_uses lowers the rounds
    assert agent.consumed == {"session_id"} and agent.consumed_tools == {0, 1}
    assert agent.web_search_options == {
        "user_location": {
            "type": "approximate",
            "approximate": {"city": "Zürich", "country": "CH"},
        },
        "filters": {"allowed_domains": ["en.wikipedia.org"]},
    }
    stripped = agent.strip(body)
    assert stripped["tools"] == [{"name": "get_weather", "input_schema": {"type": "object"}}]
    plan = MessagesApi().plan(stripped, PlanContext(TENANT, "n"))
    worker = agent.apply(chat_body(plan, ROUTE_ID))
    assert [t["type"] for t in worker["tools"]] == ["function", "code_interpreter"]
    assert worker["web_search_options"] == agent.web_search_options
    assert worker["session_id"] == worker_session_id(KEY, "acme", "claude-session")
    assert (worker["agent_permission"], worker["max_tool_rounds"], worker["stream"]) == (
        "ask",
        3,
        True,
    )


def test_messages_enable_code_execution_and_the_dynamic_web_search() -> None:
    agent = rewrite_messages(messages(enable_code_execution=True), ctx())
    assert (
        agent is not None
        and agent.tools == {"python"}
        and agent.consumed == {"enable_code_execution"}
    )
    agent = rewrite_messages(messages(enable_code_execution=False, max_tool_rounds=2), ctx())
    assert agent is not None and agent.tools == frozenset() and agent.rounds == 2
    dynamic = {"type": "web_search_20260209", "name": "web_search"}
    agent = rewrite_messages(messages(tools=[dynamic]), ctx())
    assert agent is not None and agent.tools == {"web_search", "python"}
    web_only = PolicyAgents.model_validate(
        {"tools": ["web_search"], "web": {"allowed_domains": ["docs.example.com"]}}
    )
    error = refusal(rewrite_messages, messages(tools=[dynamic]), ctx(web_only))
    assert (error.code, error.param) == ("tool_not_allowed", "tools[0]")


@pytest.mark.parametrize(
    ("extra", "code", "param"),
    [
        ({"web_search_options": {}}, "unsupported_field", "web_search_options"),
        ({"container": {"skills": []}}, "unsupported_field", "container"),
        ({"mcp_servers": []}, "unsupported_field", "mcp_servers"),
        (
            {"tools": [{"type": "bash_20250124", "name": "bash"}]},
            "unsupported_field",
            "tools[0].type",
        ),
        (
            {"tools": [{"type": "text_editor_20250124", "name": "e"}]},
            "unsupported_field",
            "tools[0].type",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search", "blocked": 1}]},
            "unsupported_field",
            "tools[0].blocked",
        ),
        (
            {"tools": [{"type": "web_search_20250305"}, {"type": "web_search_20250305"}]},
            "invalid_request",
            "tools[1]",
        ),
        (
            {"tools": [{"name": "docs_lookup", "input_schema": {}}]},
            "invalid_request",
            "tools[0].name",
        ),
        ({"enable_code_execution": "yes"}, "invalid_request", "enable_code_execution"),
    ],
)
def test_messages_refusals(extra: dict[str, Any], code: str, param: str) -> None:
    error = refusal(rewrite_messages, messages(**extra), ctx())
    assert (error.code, error.param) == (code, param)
