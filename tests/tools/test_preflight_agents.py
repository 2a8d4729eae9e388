"""``check`` on agents (spec §22, §24): the session key, the MCP client config,
and the schema refusals it lists with the rest (an agentic flag in
``launch.extra_args``, an address in ``allowed_domains``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.config import GatewayConfig
from gateway.testing.harness import DEMO_SECRET_ENV, SIM_ROUTE, default_policy, write_config
from gateway.tools.cli import main
from gateway.tools.preflight import preflight
from gateway.tools.preflight_agents import check_agents
from tests.support.jwt import HS_SECRET
from tests.support.stack import issuers

KEY_ENV = "GW_SESSION_KEY"
KEY = "k" * 32


def config(agents: dict[str, Any] | None, key_env: str | None = KEY_ENV) -> GatewayConfig:
    upstream: dict[str, Any] = {"route": SIM_ROUTE}
    if agents is not None:
        upstream["agents"] = agents
    gateway_agents = {"session_key_env": key_env} if key_env else {}
    return GatewayConfig.model_validate({"upstream": upstream, "agents": gateway_agents})


def problems(cfg: GatewayConfig, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    return [
        (f.level, f"{f.key}: {f.problem}")
        for f in check_agents(cfg, {KEY_ENV: KEY} if env is None else env)
    ]


def test_no_agents_no_findings() -> None:
    assert problems(config(None, key_env=None), {}) == []


def test_a_route_with_agents_needs_the_session_key() -> None:
    assert problems(config({"python": True}, key_env=None)) == [
        ("error", "agents.session_key_env: must be set when a route has agents (spec §24)")
    ]
    short = problems(config({"python": True}), {KEY_ENV: "k" * 31})
    assert short == [
        (
            "error",
            f"agents.session_key_env: environment variable {KEY_ENV} must hold at least 32 bytes",
        )
    ]
    assert problems(config({"python": True}), {}) == short
    assert problems(config({"python": True})) == []


def test_the_key_never_shows() -> None:
    secret = "s3cr3t-" * 3
    for finding in check_agents(config({"python": True}), {KEY_ENV: secret}):
        assert secret not in str(finding)


def _mcp(tmp_path: Path, document: Any) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def _server(prefix: str | None, **extra: Any) -> dict[str, Any]:
    server: dict[str, Any] = {
        "name": "docs",
        "source": {"type": "Http", "url": "https://mcp.example.com/"},
        "bearer_token": "tok-never-shown",
        **extra,
    }
    if prefix is not None:
        server["tool_prefix"] = prefix
    return server


def _route(path: Path, prefixes: list[str]) -> dict[str, Any]:
    return {"mcp_config": str(path), "mcp_prefixes": prefixes}


def test_an_mcp_config_whose_servers_have_their_prefixes_passes(tmp_path: Path) -> None:
    path = _mcp(
        tmp_path, {"servers": [_server("docs"), _server("wiki")], "auto_register_tools": True}
    )
    assert problems(config(_route(path, ["docs", "wiki"]))) == []


def test_a_server_without_tool_prefix_is_refused(tmp_path: Path) -> None:
    path = _mcp(
        tmp_path, {"servers": [_server("docs"), _server(None)], "auto_register_tools": True}
    )
    found = problems(config(_route(path, ["docs"])))
    assert found == [
        (
            "error",
            "upstream.agents.mcp_config: servers[1] has no tool_prefix (policies cannot name it)",
        )
    ]
    assert "tok-never-shown" not in str(found)


def test_a_disabled_server_needs_no_prefix(tmp_path: Path) -> None:
    document = {
        "servers": [_server("docs"), _server(None, enabled=False)],
        "auto_register_tools": True,
    }
    assert problems(config(_route(_mcp(tmp_path, document), ["docs"]))) == []


def test_prefixes_that_disagree_with_the_file_are_warnings(tmp_path: Path) -> None:
    path = _mcp(tmp_path, {"servers": [_server("docs")], "auto_register_tools": True})
    assert problems(config(_route(path, ["wiki"]))) == [
        (
            "warning",
            "upstream.agents.mcp_config: servers[0]'s tool_prefix is not in mcp_prefixes: every "
            "tool of it will be denied",
        ),
        (
            "warning",
            "upstream.agents.mcp_config: mcp_prefixes names wiki, which no enabled server has",
        ),
    ]


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ("{not json", "is not JSON"),
        ({"auto_register_tools": True}, "has no `servers` list"),
        ({"servers": ["x"]}, "servers[0] is not an object"),
    ],
)
def test_broken_mcp_configs(tmp_path: Path, document: Any, problem: str) -> None:
    found = problems(config(_route(_mcp(tmp_path, document), ["docs"])))
    assert found and found[0][0] == "error" and problem in found[0][1]


def test_a_missing_mcp_config_names_its_key(tmp_path: Path) -> None:
    found = problems(config(_route(tmp_path / "absent.json", ["docs"])))
    assert found == [("error", "upstream.agents.mcp_config: cannot read (FileNotFoundError)")]


def test_upstreams_entries_are_named_by_index(tmp_path: Path) -> None:
    path = _mcp(tmp_path, {"servers": [_server(None)], "auto_register_tools": True})
    cfg = GatewayConfig.model_validate(
        {
            "upstreams": [
                {"name": "a", "routes": ["/r/a"]},
                {"name": "b", "routes": ["/r/b"], "agents": _route(path, ["docs"])},
            ],
            "agents": {"session_key_env": KEY_ENV},
        }
    )
    assert [key for _, key in problems(cfg)] == [
        "upstreams[1].agents.mcp_config: servers[0] has no tool_prefix (policies cannot name it)",
        "upstreams[1].agents.mcp_config: mcp_prefixes names docs, which no enabled server has",
    ]


def test_preflight_runs_the_agents_checks(tmp_path: Path) -> None:
    assert [f.key for f in preflight(config({"python": True}, key_env=None), {})] == [
        "agents.session_key_env"
    ]


def test_check_lists_agentic_flags_and_addresses_with_the_other_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEMO_SECRET_ENV, HS_SECRET)
    bundle = SIM_ROUTE.rsplit("/", 1)[-1]
    launch = {
        "version": "0.9.2",
        "binary_sha256": "12" * 32,
        "model_public_id": "x",
        "model_revision": "r",
        "model_bundle_sha256": bundle,
        "model_dir": SIM_ROUTE,
        "port": 1234,
        "extra_args": ["--seed", "1", "--mcp-port", "4000"],
    }
    agents = {"tools": ["web_search"], "web": {"allowed_domains": ["docs.example.com", "10.0.0.7"]}}
    path = write_config(
        tmp_path,
        upstream_port=1234,
        policies={"acme": default_policy("acme", agents=agents)},
        issuers=issuers(),
        upstream={"launch": launch},
    )
    assert main(["check", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "upstream.launch.extra_args[2]: Value error, agents_flag_forbidden: --mcp" in err
    assert "4000" not in err
    assert "agents.web.allowed_domains[1]: Value error, is an IP address" in err
