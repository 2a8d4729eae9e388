"""Agents (spec §22, §24): what a route's worker may run, what a tenant may
have it run, and the gateway-wide part (the session key, pinned names, the
ceilings every policy is checked against).

* :class:`RouteAgents` -- ``agents:`` on a worker (``upstream:`` or an
  ``upstreams[]`` entry): the tools its launch turns on and the ceiling on
  tool rounds. Absent: the worker is launched with no agentic flag.
* :class:`PolicyAgents` -- ``agents:`` in a tenant policy: the tools, the web
  domains, who approves, and the run's bounds. Absent: every agentic field is
  ``unsupported_field``.
* :class:`GatewayAgents` -- ``agents:`` in gateway.yaml.

Domains are names only: an ``allowed_domains`` entry is normalized the way
the approval rules read hosts (``gateway/core/hostnames.py``), and an address
in any form is refused. Policy-vs-config rules (ceilings, rounds against the
route's) live in ``policy.py`` with the others.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, IPvAnyAddress, model_validator

from gateway.config.base import Model, PositiveFloat, PositiveInt
from gateway.core.hostnames import domain_pattern, parse_host

#: an MCP server's ``tool_prefix`` (its tools are named ``<prefix>_<name>``)
MCP_PREFIX = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
#: ``web_search``, ``python``, or ``mcp:`` and a glob over MCP tool names
POLICY_TOOL = r"^(web_search|python|mcp:[A-Za-z0-9_.*?\[\]!-]{1,128})$"
#: the worker denies an approval it waited 300 s for (reference §3.2)
WORKER_APPROVAL_TIMEOUT_S = 300
#: the worker embeds file bodies up to 8 MiB in its stream (reference §3.4)
WORKER_EMBED_LIMIT_BYTES = 8 * 1024 * 1024
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


def _name(value: str) -> str:
    host = parse_host(value)
    if host.name is None:
        raise ValueError("must be a host name, not an address")
    return host.name


DomainPattern = Annotated[str, AfterValidator(domain_pattern)]
HostName = Annotated[str, AfterValidator(_name)]


class RouteAgents(Model):
    """What the worker serving this route may run for tenants (spec §22 "Route and launch")."""

    web_search: bool = Field(
        False,
        description=(
            "The worker may fetch the web (search and page extraction); the launch adds no "
            "flag (the worker needs none), approvals guard every fetch."
        ),
    )
    python: bool = Field(
        False,
        description=(
            "Python execution: the launch adds --enable-code-execution --sandbox on "
            "--sandbox-network none."
        ),
    )
    mcp_config: str | None = Field(
        None,
        description=(
            "Absolute path of the worker's MCP client config (--mcp-config); `check` reads it "
            "and refuses a server without `tool_prefix`."
        ),
    )
    mcp_prefixes: list[Annotated[str, Field(pattern=MCP_PREFIX)]] = Field(
        [],
        description=(
            "The `tool_prefix` of each server in mcp_config; a custom tool outside them is "
            "denied `tool_not_allowed`."
        ),
    )
    max_tool_rounds: Annotated[int, Field(ge=1, le=256)] = Field(
        16,
        description="--max-tool-rounds, and the ceiling of every policy's agents.max_tool_rounds.",
    )

    @model_validator(mode="after")
    def _checks(self) -> RouteAgents:
        if not (self.web_search or self.python or self.mcp_config):
            raise ValueError("agents must turn on web_search, python or mcp_config")
        if self.mcp_config is not None and not self.mcp_config.startswith("/"):
            raise ValueError("mcp_config must be an absolute path (the worker reads it)")
        if (self.mcp_config is None) != (not self.mcp_prefixes):
            raise ValueError("mcp_config and mcp_prefixes go together")
        if len(set(self.mcp_prefixes)) != len(self.mcp_prefixes):
            raise ValueError("mcp_prefixes must be distinct")
        return self


class AgentWeb(Model):
    """Where the worker may fetch for this tenant."""

    allowed_domains: list[DomainPattern] = Field(
        min_length=1,
        description=(
            "Host names a fetch may name: exact, or `*.suffix` for names below it "
            "(case-insensitive, IDNA); names only, an address is refused."
        ),
    )


class AgentFiles(Model):
    """Produced files kept per request (decoded bytes); past either bound a file is
    dropped and counted, and the run goes on."""

    max_bytes: PositiveInt = Field(
        WORKER_EMBED_LIMIT_BYTES,
        description=(
            "Decoded bytes of the files kept for one request, together; also sizes the line "
            "bound of agentic streams (x 4/3 + 4 KiB)."
        ),
    )
    max_count: Annotated[int, Field(ge=0)] = Field(16, description="Files kept per request.")


class AgentFileCeilings(Model):
    """Ceilings of every policy's ``agents.files``."""

    max_bytes: PositiveInt = Field(
        67_108_864, description="Ceiling of policies' agents.files.max_bytes."
    )
    max_count: Annotated[int, Field(ge=0)] = Field(
        64, description="Ceiling of policies' agents.files.max_count."
    )


class PolicyAgents(Model):
    """The tools this tenant may have the worker run, and the run's bounds (spec §22 "Policy")."""

    tools: list[Annotated[str, Field(pattern=POLICY_TOOL)]] = Field(
        min_length=1,
        description=(
            "`web_search`, `python` (code and file tools), `mcp:<glob>` (MCP tools whose name "
            "matches the glob, e.g. `mcp:docs_*`)."
        ),
    )
    web: AgentWeb | None = Field(None, description="Required with web_search.")
    approval: Literal["gateway", "caller"] = Field(
        "gateway",
        description=(
            "gateway: the policy decides alone; caller: the policy, then the caller (stream "
            "callers with `x-agent-events: 1`)."
        ),
    )
    approval_timeout_s: Annotated[float, Field(gt=0, le=WORKER_APPROVAL_TIMEOUT_S)] = Field(
        60, description="How long the caller has to decide; then denied `approval_timeout`."
    )
    max_tool_rounds: Annotated[int, Field(ge=1, le=256)] = Field(
        8,
        description="Tool rounds per request (a caller's value is clamped to it); ≤ the route's.",
    )
    max_run_s: PositiveFloat = Field(
        120, description="Wall time of one agentic request; then `agent_run_timeout`."
    )
    reserve_tokens_per_round: Annotated[int, Field(ge=0)] = Field(
        2048, description="Added to the token reservation per allowed round."
    )
    files: AgentFiles = Field(AgentFiles(), description="Produced files kept per request.")

    @model_validator(mode="after")
    def _checks(self) -> PolicyAgents:
        if len(set(self.tools)) != len(self.tools):
            raise ValueError("tools must be distinct")
        if "web_search" in self.tools and self.web is None:
            raise ValueError("web_search needs web.allowed_domains")
        if "web_search" not in self.tools and self.web is not None:
            raise ValueError("web is only for web_search")
        return self


class GatewayAgents(Model):
    """The gateway-wide part of agents (spec §24): the session key, pinned names, and the
    ceilings of every policy's agents section."""

    session_key_env: Annotated[str, Field(pattern=ENV_NAME)] | None = Field(
        None,
        description=(
            "Environment variable holding the key (≥ 32 bytes) that turns a caller's "
            "session_id into the worker's; `check` requires it when any route has agents."
        ),
    )
    hosts: dict[HostName, Annotated[list[IPvAnyAddress], Field(min_length=1)]] = Field(
        {},
        description=(
            "Names answered before DNS (pinning, air-gapped sites, tests); the addresses must "
            "still be public for a fetch to be approved."
        ),
    )
    max_run_s: PositiveFloat = Field(600, description="Ceiling of policies' agents.max_run_s.")
    max_reserve_tokens_per_round: Annotated[int, Field(ge=0)] = Field(
        65_536, description="Ceiling of policies' agents.reserve_tokens_per_round."
    )
    files: AgentFileCeilings = Field(
        AgentFileCeilings(), description="Ceilings of policies' agents.files."
    )
