"""Agents config (spec §22, §24): route, policy and gateway sections, and the
policy-vs-config rules (ceilings, rounds against the route's)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import GatewayConfig, PolicyAgents, RouteAgents
from gateway.config.policy import TenantPolicy, check_policy

ROUTE = "/srv/mosaic-models/" + "0" * 64
OTHER = "/srv/mosaic-models/" + "1" * 64

WEB = {"tools": ["web_search"], "web": {"allowed_domains": ["docs.example.com"]}}


def gateway(route_agents: dict[str, Any] | None = None, **extra: Any) -> GatewayConfig:
    upstream: dict[str, Any] = {"route": ROUTE}
    if route_agents is not None:
        upstream["agents"] = route_agents
    return GatewayConfig.model_validate({"upstream": upstream, **extra})


def policy(agents: dict[str, Any], **extra: Any) -> TenantPolicy:
    return TenantPolicy.model_validate(
        {"tenant": "acme", "models": {"m": ROUTE}, "agents": agents, **extra}
    )


# --- route -----------------------------------------------------------------------


def test_route_agents_on_the_shorthand_and_on_upstreams_entries() -> None:
    agents = {"web_search": True, "python": True, "max_tool_rounds": 12}
    one = gateway(agents)
    assert one.upstream is not None and one.upstream.agents == RouteAgents(**agents)
    many = GatewayConfig.model_validate(
        {"upstreams": [{"name": "chat", "routes": [ROUTE], "agents": agents}]}
    )
    assert many.workers[0].agents == RouteAgents(**agents)
    assert gateway().workers[0].agents is None


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ({}, "must turn on"),
        ({"web_search": False}, "must turn on"),
        ({"mcp_config": "mcp.json", "mcp_prefixes": ["docs"]}, "absolute"),
        ({"mcp_config": "/etc/gw/mcp.json"}, "go together"),
        ({"python": True, "mcp_prefixes": ["docs"]}, "go together"),
        ({"mcp_config": "/m.json", "mcp_prefixes": ["docs", "docs"]}, "distinct"),
        ({"mcp_config": "/m.json", "mcp_prefixes": ["do cs"]}, "pattern"),
        ({"python": True, "max_tool_rounds": 0}, "greater than or equal"),
        ({"python": True, "max_tool_rounds": 257}, "less than or equal"),
        ({"python": True, "enable_shell": True}, "Extra inputs"),
    ],
)
def test_route_agents_refusals(agents: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RouteAgents.model_validate(agents)


def test_agents_need_a_one_model_launch() -> None:
    bundle = "ab" * 32
    model = {
        "model_public_id": "x",
        "model_revision": "r",
        "model_bundle_sha256": bundle,
        "model_dir": f"/srv/m/{bundle}",
    }
    launch = {"version": "0.9.2", "binary_sha256": "12" * 32, "models": [model]}
    upstream = {"name": "chat", "routes": [model["model_dir"]], "launch": launch}
    GatewayConfig.model_validate({"upstreams": [upstream]})  # fine without agents
    with pytest.raises(ValidationError, match="one-model launch"):
        GatewayConfig.model_validate({"upstreams": [{**upstream, "agents": {"python": True}}]})


# --- policy ----------------------------------------------------------------------


def test_policy_defaults_follow_the_spec_example() -> None:
    agents = PolicyAgents.model_validate(WEB)
    assert (agents.approval, agents.approval_timeout_s, agents.max_tool_rounds) == (
        "gateway",
        60,
        8,
    )
    assert (agents.max_run_s, agents.reserve_tokens_per_round) == (120, 2048)
    assert (agents.files.max_bytes, agents.files.max_count) == (8_388_608, 16)


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ({"tools": []}, "at least 1"),
        ({"tools": ["shell"]}, "pattern"),
        ({"tools": ["mcp:"]}, "pattern"),
        ({"tools": ["mcp:docs_*", "mcp:docs_*"]}, "distinct"),
        ({"tools": ["web_search"]}, "needs web.allowed_domains"),
        ({"tools": ["python"], "web": {"allowed_domains": ["a.com"]}}, "only for web_search"),
        ({**WEB, "web": {"allowed_domains": []}}, "at least 1"),
        ({**WEB, "approval": "never"}, "gateway"),
        ({**WEB, "approval_timeout_s": 301}, "less than or equal to 300"),
        ({**WEB, "approval_timeout_s": 0}, "greater than 0"),
        ({**WEB, "max_tool_rounds": 0}, "greater than or equal"),
        ({**WEB, "files": {"max_bytes": 0}}, "greater than 0"),
        ({**WEB, "remember_for_session": True}, "Extra inputs"),
    ],
)
def test_policy_agents_refusals(agents: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PolicyAgents.model_validate(agents)


@pytest.mark.parametrize(
    ("entry", "normalized"),
    [
        ("docs.example.com", "docs.example.com"),
        ("Docs.Example.COM.", "docs.example.com"),
        ("*.Wikipedia.org", "*.wikipedia.org"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("*.faß.de", "*.xn--fa-hia.de"),
    ],
)
def test_allowed_domains_are_normalized_names(entry: str, normalized: str) -> None:
    agents = PolicyAgents.model_validate({**WEB, "web": {"allowed_domains": [entry]}})
    assert agents.web is not None and agents.web.allowed_domains == [normalized]


@pytest.mark.parametrize(
    "entry",
    [
        "10.0.0.1",
        "169.254.169.254",
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "[::1]",
        "::1",
        "fd00:ec2::254",
        "\uff11\uff12\uff17.\uff10.\uff10.\uff11",
        "*.10.0.0.1",
        "*",
        "docs.*.com",
        "example.com:443",
        "",
        "exa mple.com",
    ],
)
def test_allowed_domains_refuse_addresses_and_non_names(entry: str) -> None:
    with pytest.raises(ValidationError, match="allowed_domains"):
        PolicyAgents.model_validate({**WEB, "web": {"allowed_domains": [entry]}})


def test_an_address_in_allowed_domains_says_names_only() -> None:
    with pytest.raises(ValidationError, match="names only"):
        PolicyAgents.model_validate({**WEB, "web": {"allowed_domains": ["10.0.0.1"]}})


# --- gateway section -------------------------------------------------------------


def test_gateway_agents_section() -> None:
    config = gateway(
        {"web_search": True},
        agents={
            "session_key_env": "GW_SESSION_KEY",
            "hosts": {"Docs.Example.com.": ["93.184.216.34", "2606:2800:220:1::1"]},
        },
    )
    assert config.agents.session_key_env == "GW_SESSION_KEY"
    assert config.agents.hosts == {
        "docs.example.com": [
            ipaddress.ip_address("93.184.216.34"),
            ipaddress.ip_address("2606:2800:220:1::1"),
        ]
    }


@pytest.mark.parametrize(
    "agents",
    [
        {"hosts": {"docs.example.com": []}},
        {"hosts": {"docs.example.com": ["not-an-address"]}},
        {"hosts": {"10.0.0.1": ["10.0.0.1"]}},
        {"session_key_env": "1BAD"},
        {"max_run_s": 0},
        {"unknown": 1},
    ],
)
def test_gateway_agents_refusals(agents: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        gateway(agents=agents)


# --- policy against the config -----------------------------------------------------


def test_a_policy_within_the_ceilings_and_the_routes_rounds_passes() -> None:
    assert (
        check_policy(policy({**WEB, "max_tool_rounds": 16}), "acme", gateway({"python": True}))
        == []
    )


def test_policy_rounds_must_not_exceed_the_routes() -> None:
    problems = check_policy(
        policy({**WEB, "max_tool_rounds": 9}),
        "acme",
        gateway({"python": True, "max_tool_rounds": 8}),
    )
    assert problems == [("agents.max_tool_rounds", f"9 exceeds route {ROUTE}'s max_tool_rounds 8")]


def test_routes_without_agents_set_no_round_ceiling() -> None:
    assert check_policy(policy({**WEB, "max_tool_rounds": 200}), "acme", gateway()) == []


def test_a_release_checks_both_arms() -> None:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [
                {"name": "a", "routes": [ROUTE], "agents": {"python": True, "max_tool_rounds": 20}},
                {"name": "b", "routes": [OTHER], "agents": {"python": True, "max_tool_rounds": 4}},
            ],
            "releases": [{"name": "r", "stable": ROUTE, "canary": OTHER, "canary_percent": 10}],
        }
    )
    tenant = policy({**WEB, "max_tool_rounds": 8}, models={"m": "release:r"})
    assert check_policy(tenant, "acme", config) == [
        ("agents.max_tool_rounds", f"8 exceeds route {OTHER}'s max_tool_rounds 4")
    ]


def test_policy_agents_are_bounded_by_the_gateway_ceilings() -> None:
    config = gateway(
        {"web_search": True},
        agents={
            "max_run_s": 60,
            "max_reserve_tokens_per_round": 100,
            "files": {"max_bytes": 1000, "max_count": 2},
        },
    )
    tenant = policy({**WEB, "files": {"max_bytes": 1001, "max_count": 3}})
    keys = [key for key, _ in check_policy(tenant, "acme", config)]
    assert keys == [
        "agents.max_run_s",
        "agents.reserve_tokens_per_round",
        "agents.files.max_bytes",
        "agents.files.max_count",
    ]
