"""Launch contract with a route's agents (spec §22 "Route and launch", §24):
today's plan exactly without them; the agentic tail, and nothing else, with them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import GatewayConfig, LaunchConfig, RouteAgents
from gateway.upstream.launch import (
    UnsafeLaunchError,
    agent_flags,
    build_argv,
    build_plan,
    check_argv,
    launch_plan_json,
    serve_identity,
)
from tests.upstream.test_launch import BUNDLE, LAUNCH, make, recipe

ROUTE = f"/srv/mosaic-models/{BUNDLE}"
ALL = RouteAgents(
    web_search=True,
    python=True,
    mcp_config="/etc/gw/mcp.json",
    mcp_prefixes=["docs"],
    max_tool_rounds=12,
)
NEVER = ("--mcp-port", "--tool-dispatch-url", "--enable-shell", "--agent", "--enable-search")


def test_without_agents_the_plan_is_todays() -> None:
    assert build_argv(make(), None) == build_argv(make())
    assert agent_flags(None) == []
    plan = build_plan(make())
    assert plan.launch == LAUNCH
    assert plan.serve_identity == recipe(LAUNCH)
    assert not any(t.startswith(("--agent", "--max-tool-rounds")) for t in plan.argv)


def test_with_every_agent_the_tail_is_exactly_the_spec() -> None:
    argv = build_argv(make(), ALL)
    assert argv[: len(build_argv(make()))] == build_argv(make())
    assert argv[len(build_argv(make())) :] == [
        "--agent-permission",
        "ask",
        "--enable-code-execution",
        "--sandbox",
        "on",
        "--sandbox-network",
        "none",
        "--mcp-config",
        "/etc/gw/mcp.json",
        "--max-tool-rounds",
        "12",
    ]


@pytest.mark.parametrize(
    ("agents", "tail"),
    [
        (
            RouteAgents(web_search=True),
            ["--agent-permission", "ask", "--max-tool-rounds", "16"],
        ),
        (
            RouteAgents(python=True, max_tool_rounds=3),
            [
                "--agent-permission",
                "ask",
                "--enable-code-execution",
                "--sandbox",
                "on",
                "--sandbox-network",
                "none",
                "--max-tool-rounds",
                "3",
            ],
        ),
        (
            RouteAgents(mcp_config="/m.json", mcp_prefixes=["x"]),
            ["--agent-permission", "ask", "--mcp-config", "/m.json", "--max-tool-rounds", "16"],
        ),
    ],
)
def test_each_agent_adds_its_flags_only(agents: RouteAgents, tail: list[str]) -> None:
    assert agent_flags(agents) == tail
    assert build_argv(make(), agents)[-len(tail) :] == tail
    for flag in NEVER:
        assert flag not in build_argv(make(), agents)


def test_the_denylist_takes_the_agentic_tail_only_as_the_route_declares_it() -> None:
    argv = build_argv(make(), ALL)
    check_argv(argv, ALL)
    with pytest.raises(UnsafeLaunchError):
        check_argv(argv)  # the same flags without the route's agents
    with pytest.raises(UnsafeLaunchError):
        check_argv(argv, RouteAgents(python=True))
    for flag in NEVER:
        with pytest.raises(UnsafeLaunchError):
            check_argv([*argv[:-2], flag, *argv[-2:]], ALL)
    tampered = [t if t != "none" else "full" for t in argv]
    with pytest.raises(UnsafeLaunchError):
        check_argv(tampered, ALL)


def test_agents_change_the_identity_and_show_in_the_launch_object() -> None:
    plan = build_plan(make(), ALL)
    assert plan.launch == {**LAUNCH, "agents": ALL.model_dump(mode="json", exclude_none=True)}
    assert plan.serve_identity == recipe(plan.launch) == serve_identity(make(), ALL)
    assert plan.serve_identity != serve_identity(make())
    other = RouteAgents(**{**ALL.model_dump(), "max_tool_rounds": 13})
    assert serve_identity(make(), other) != plan.serve_identity


def _upstream(**extra: Any) -> dict[str, Any]:
    return {"base_url": "http://127.0.0.1:1234", "route": ROUTE, "launch": LAUNCH, **extra}


def test_launch_plan_json_uses_the_routes_agents_in_both_forms() -> None:
    agents = {"python": True, "max_tool_rounds": 4}
    one = GatewayConfig.model_validate({"upstream": _upstream(agents=agents)})
    assert launch_plan_json(one)["argv"][-2:] == ["--max-tool-rounds", "4"]
    many = GatewayConfig.model_validate(
        {
            "upstreams": [
                {"name": "chat", "routes": [ROUTE], "launch": LAUNCH, "agents": agents},
            ]
        }
    )
    assert launch_plan_json(many)["upstreams"]["chat"] == launch_plan_json(one)
    plain = GatewayConfig.model_validate({"upstream": _upstream()})
    assert launch_plan_json(plain) == build_plan(make()).to_json()


# --- launch.extra_args ------------------------------------------------------------


def test_extra_args_are_appended_before_the_agentic_tail() -> None:
    argv = build_argv(make(extra_args=["--seed", "7", "--throughput"]), ALL)
    base = build_argv(make())
    assert argv[len(base) : len(base) + 3] == ["--seed", "7", "--throughput"]
    assert argv[len(base) + 3 :] == agent_flags(ALL)


@pytest.mark.parametrize(
    "flag",
    [
        "--mcp-port",
        "--mcp-port=4321",
        "--tool-dispatch-url",
        "--enable-shell",
        "--agent",
        "--agent-permission",
        "--enable-code-execution",
        "--enable-search",
        "--max-tool-rounds",
        "--mcp-config",
        "--sandbox-network",
        "--code-exec-timeout",
        "--shell-path",
        "--skills-dir",
        "--search-embedding-model",
    ],
)
def test_agentic_extra_args_are_agents_flag_forbidden(flag: str) -> None:
    with pytest.raises(ValidationError, match="agents_flag_forbidden") as caught:
        make(extra_args=[flag])
    # What the loader prints (never the input): the family, not the token.
    messages = [e["msg"] for e in caught.value.errors(include_input=False)]
    assert messages and not any("4321" in m for m in messages)


@pytest.mark.parametrize(
    "flag",
    ["--host", "--port=1", "--no-ui", "--ui", "--log", "-l", "--lora", "--enable-lora", "-m"],
)
def test_contract_flags_are_refused_in_extra_args(flag: str) -> None:
    with pytest.raises(ValidationError, match="extra_args"):
        make(extra_args=[flag])


def test_extra_args_are_for_a_one_model_launch() -> None:
    model = {
        "model_public_id": "x",
        "model_revision": "r",
        "model_bundle_sha256": BUNDLE,
        "model_dir": ROUTE,
    }
    with pytest.raises(ValidationError, match="one-model launch"):
        LaunchConfig.model_validate(
            {"version": "0.9.2", "binary_sha256": "12" * 32, "models": [model], "extra_args": []}
        )
