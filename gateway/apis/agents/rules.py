"""The gateway's decision on each tool call the worker asks to run (spec §22
"Approvals", §24). Pure: typed inputs in, a :class:`Decision` out.

Rules, in order, for each ``agentic_tool_approval_required``:

1. **The tool must be allowed.** ``tool.kind`` ``web_search`` (the search
   and page-extraction tools) needs policy tool ``web_search``;
   ``code_execution`` and ``file`` (read, list, surface files) need
   ``python``; a ``custom`` tool whose name starts with ``<prefix>_`` for one
   of the route's ``mcp_prefixes`` needs a policy ``mcp:<glob>`` matching its
   name (``fnmatchcase``). Anything else (shell, external dispatch, a client
   function, an MCP tool outside the prefixes, a kind this release does not
   know) is denied ``tool_not_allowed``. A tool also needs its route to run it.
2. **A web fetch must name an allowed, public host** (``webtarget.py`` says
   what a fetch is and how its URL is read): an IP literal in any form is
   ``address_not_public`` whatever ``allowed_domains`` says; a name must match
   ``allowed_domains`` (exact, or ``*.`` for names below; case-insensitive,
   IDNA, trailing dot dropped) or it is ``domain_not_allowed``; URLs named
   inside it (``?url=…``) must name allowed names too. Then the name is
   resolved, and every address must be public (``addresses.py``): none is
   ``unresolvable``, one that is not public is ``address_not_public``. A plain
   search query names no fetch target and needs no resolution.
3. With ``approval: caller`` the caller is asked next (the edge's part:
   ``caller_denied``, ``approval_timeout``, :func:`deny`).

So the I/O edge runs: ``decide(rules, call)``; on ``resolve``, it resolves
:attr:`Decision.host` (``agents.hosts`` first, then DNS, 2 s bound; nothing
in time is no address) and calls ``decide(rules, call, addresses)`` again;
then (caller approval) asks the caller; then posts :meth:`Decision.body`.
What the resolver answers is checked here, but the worker resolves the name
again when it fetches and follows redirects unchecked (``webtarget.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final, Literal

from gateway.apis.agents.addresses import all_public
from gateway.apis.agents.webtarget import TargetRefused, parse_target, target_url
from gateway.apis.agents.wire import EXTRACT, SEARCH, ApprovalRequired
from gateway.config.agents import PolicyAgents, RouteAgents
from gateway.core.hostnames import Address, matches

__all__ = ["REASONS", "AgentRules", "Decision", "PolicyTool", "Reason", "decide", "deny"]

Reason = Literal[
    "domain_not_allowed",
    "address_not_public",
    "unresolvable",
    "tool_not_allowed",
    "caller_denied",
    "approval_timeout",
]
#: the policy's word for a tool (receipts' ``kind``)
PolicyTool = Literal["web_search", "python", "mcp"]

#: what the model reads as the tool's result: the rule, never the host or arguments
REASONS: Final[dict[Reason, str]] = {
    "domain_not_allowed": "the web host is not on this tenant's allowed list",
    "address_not_public": "the web host is an address, or resolves to one, that is not public",
    "unresolvable": "the web host did not resolve in time",
    "tool_not_allowed": "this tool is not allowed for this tenant",
    "caller_denied": "the caller denied this call",
    "approval_timeout": "the caller did not decide in time",
}
_KINDS: Final[dict[str, PolicyTool]] = {
    "web_search": "web_search",
    "code_execution": "python",
    "file": "python",
}


@dataclass(frozen=True, slots=True)
class AgentRules:
    """What one request may have the worker run: the policy's tools its route
    runs, the policy's domains, the route's MCP prefixes."""

    tools: tuple[str, ...]
    allowed_domains: tuple[str, ...] = ()
    mcp_prefixes: tuple[str, ...] = ()

    @classmethod
    def build(cls, policy: PolicyAgents, route: RouteAgents) -> AgentRules:
        runs = {"web_search": route.web_search, "python": route.python}
        tools = tuple(
            t for t in policy.tools if runs.get(t, t.startswith("mcp:") and bool(route.mcp_config))
        )
        domains = tuple(policy.web.allowed_domains) if policy.web is not None else ()
        return cls(tools, domains, tuple(route.mcp_prefixes))


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Literal["approve", "deny", "resolve"]
    reason: Reason | None = None
    #: the policy's word for the tool; None for a tool no policy can name
    kind: PolicyTool | None = None
    #: the fetch's host (``resolve``: the name to resolve)
    host: str | None = None

    @property
    def message(self) -> str:
        if self.reason is None:
            return "Approved by the gateway."
        return f"Denied by the gateway ({self.reason}): {REASONS[self.reason]}."

    def body(self) -> dict[str, str]:
        """What the gateway posts to the worker's ``/v1/agent/approvals/{id}``
        (never ``remember_for_session``)."""
        if self.verdict == "resolve":
            raise ValueError("resolve the host first")
        return {"decision": self.verdict, "message": self.message}


def deny(reason: Reason, kind: PolicyTool | None = None) -> Decision:
    return Decision("deny", reason, kind)


def decide(
    rules: AgentRules, call: ApprovalRequired, addresses: Sequence[Address] | None = None
) -> Decision:
    """The decision on ``call``; ``addresses``: what the edge resolved for a
    ``resolve`` decision's host."""
    kind = _policy_kind(rules, call)
    if kind is None or not _allowed(rules, kind, call):
        return deny("tool_not_allowed", kind)
    if kind != "web_search":
        return Decision("approve", kind=kind)
    try:
        url = target_url(call.tool_name, call.arguments)
        if url is None:
            return Decision("approve", kind=kind)
        target = parse_target(url)
    except TargetRefused as refused:
        return deny(refused.reason, kind)
    for host in (target.host, *target.embedded):
        if host.address is not None:
            return deny("address_not_public", kind)
        assert host.name is not None
        if not any(matches(host.name, pattern) for pattern in rules.allowed_domains):
            return deny("domain_not_allowed", kind)
    name = target.host.name
    if addresses is None:
        return Decision("resolve", kind=kind, host=name)
    if not addresses:
        return Decision("deny", "unresolvable", kind, name)
    if not all_public(addresses):
        return Decision("deny", "address_not_public", kind, name)
    return Decision("approve", kind=kind, host=name)


def _policy_kind(rules: AgentRules, call: ApprovalRequired) -> PolicyTool | None:
    if call.kind == "custom" and any(call.label.startswith(f"{p}_") for p in rules.mcp_prefixes):
        return "mcp"
    return _KINDS.get(call.kind)


def _allowed(rules: AgentRules, kind: PolicyTool, call: ApprovalRequired) -> bool:
    if kind == "mcp":
        globs = (t[4:] for t in rules.tools if t.startswith("mcp:"))
        return any(fnmatchcase(call.label, glob) for glob in globs)
    if kind == "web_search" and call.tool_name not in (SEARCH, EXTRACT):
        return False
    return kind in rules.tools
