"""Preflight of agents (spec §22, §24): what ``check`` verifies beyond the schema.

* When any worker has ``agents``, gateway ``agents.session_key_env`` must be
  set and name an environment variable holding at least 32 bytes (the HMAC
  key of the worker's session ids). Its value is never printed.
* Each ``agents.mcp_config`` is read (bounded) and parsed as the worker's
  MCP client config (reference §4.2): every enabled server must have a
  ``tool_prefix`` (without one the worker makes up a uuid prefix no policy
  can name), and each prefix should be one of the route's ``mcp_prefixes``
  and the other way round (a warning: a server outside them has every tool
  denied, a prefix without a server allows nothing).

``launch.extra_args`` with an agentic flag (``agents_flag_forbidden``) and an
address in a policy's ``allowed_domains`` are refused by the config models
themselves, so ``check`` lists them with the other schema errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig, UpstreamConfig
from gateway.tools.findings import Finding, read_bounded
from gateway.tools.findings import error as _error
from gateway.tools.findings import warning as _warning

#: the session key's least length (spec §24)
MIN_SESSION_KEY_BYTES = 32
#: far above any MCP client config an operator writes
MAX_MCP_CONFIG_BYTES = 1024 * 1024


def check_agents(config: GatewayConfig, env: Mapping[str, str]) -> list[Finding]:
    workers = _keyed_workers(config)
    agentic = [(key, w) for key, w in workers if w.agents is not None]
    if not agentic:
        return []
    findings: list[Finding] = []
    name = config.agents.session_key_env
    if name is None:
        findings.append(
            _error("agents.session_key_env", "must be set when a route has agents (spec §24)")
        )
    elif len(env.get(name, "").encode("utf-8")) < MIN_SESSION_KEY_BYTES:
        findings.append(
            _error(
                "agents.session_key_env",
                f"environment variable {name} must hold at least {MIN_SESSION_KEY_BYTES} bytes",
            )
        )
    for key, worker in agentic:
        assert worker.agents is not None
        if worker.agents.mcp_config is not None:
            findings += check_mcp_config(
                f"{key}.agents.mcp_config",
                Path(worker.agents.mcp_config),
                worker.agents.mcp_prefixes,
            )
    return findings


def _keyed_workers(config: GatewayConfig) -> list[tuple[str, UpstreamConfig]]:
    if config.upstreams is not None:
        return [(f"upstreams[{i}]", u) for i, u in enumerate(config.upstreams)]
    return [("upstream", u) for u in config.workers]


def check_mcp_config(key: str, path: Path, prefixes: list[str]) -> list[Finding]:
    data, problem = read_bounded(key, path, MAX_MCP_CONFIG_BYTES)
    if problem is not None:
        return [problem]
    assert data is not None
    try:
        document: Any = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return [_error(key, "is not JSON", path)]
    servers = document.get("servers") if isinstance(document, dict) else None
    if not isinstance(servers, list):
        return [_error(key, "has no `servers` list (the worker's MCP client config)", path)]
    findings: list[Finding] = []
    seen: set[str] = set()
    for index, server in enumerate(servers):
        if not isinstance(server, dict):
            findings.append(_error(key, f"servers[{index}] is not an object", path))
            continue
        if server.get("enabled", True) is False:
            continue
        prefix = server.get("tool_prefix")
        if not isinstance(prefix, str) or not prefix:
            findings.append(
                _error(key, f"servers[{index}] has no tool_prefix (policies cannot name it)", path)
            )
            continue
        seen.add(prefix)
        if prefix not in prefixes:
            findings.append(
                _warning(
                    key,
                    f"servers[{index}]'s tool_prefix is not in mcp_prefixes: every tool of it "
                    "will be denied",
                    path,
                )
            )
    for prefix in prefixes:
        if prefix not in seen:
            findings.append(
                _warning(key, f"mcp_prefixes names {prefix}, which no enabled server has", path)
            )
    return findings
