"""The agentic fields' shapes, and what is forwarded of them (spec §22 "Requests"). Pure.

* chat ``web_search_options``: ``search_context_size``, ``user_location``
  (``approximate``), ``filters`` (``allowed_domains``, ``blocked_domains``)
  and ``return_token_budget`` are forwarded; ``search_description`` and
  ``extract_description`` (they rewrite the tool descriptions the model
  reads) are never, nor image search or ``external_web_access``;
* chat's code tool is exactly ``{"type": "code_interpreter", "container":
  {"type": "auto"}}`` (a container id, a memory limit or file ids are not
  served);
* Messages ``web_search_*`` server tools: ``allowed_domains``,
  ``blocked_domains``, ``user_location`` and ``max_uses`` (which lowers the
  request's tool rounds; it never raises them); ``code_execution_*`` take
  nothing but their name.

``allowed_domains`` forwarded = the caller's domains ∩ the policy's
(:func:`allowed_domains`), in the worker's filter language (a name stands
for itself and the names below it; ``www.`` is dropped as the worker drops
it). The worker applies this list to search results only, after fetching
them; what the worker may fetch is decided per call by the approval rules,
which use the policy's patterns exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from gateway.apis.fields import (
    Spec,
    enum,
    harmless,
    integer,
    invalid,
    list_of,
    obj,
    string,
)
from gateway.core.hostnames import parse_host

__all__ = [
    "CODE_SERVER_TOOL",
    "CODE_TOOL",
    "CODE_TOOL_SPEC",
    "WEB_OPTIONS",
    "WEB_SERVER_TOOL",
    "allowed_domains",
    "domain_list",
    "messages_web_options",
]

#: the code tool as the worker's chat endpoint takes it
CODE_TOOL: Final = {"type": "code_interpreter", "container": {"type": "auto"}}
_NEVER = "is never forwarded (it rewrites the tool descriptions the model reads)"
_NOT_SERVED = "is not supported (agentic and server-side tool features are not served)"
_MAX_DOMAINS = 100


def _domain(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise invalid(path, "must be a string")
    try:
        host = parse_host(value.strip())
    except ValueError:
        raise invalid(path, "is not a host name") from None
    if host.name is None:
        raise invalid(path, "is an address, not a host name")
    return host.name.removeprefix("www.")


domain_list: Final = list_of(_domain, max_items=_MAX_DOMAINS)

_APPROXIMATE: Final = obj({"city": string, "country": string, "region": string, "timezone": string})
_CHAT_LOCATION: Final = obj(
    {"type": enum("approximate"), "approximate": _APPROXIMATE}, required=("type",)
)

WEB_OPTIONS: Final[Spec] = obj(
    {
        "search_context_size": enum("low", "medium", "high"),
        "user_location": _CHAT_LOCATION,
        "filters": obj({"allowed_domains": domain_list, "blocked_domains": domain_list}),
        "return_token_budget": enum("default", "unlimited"),
    },
    refused={
        "search_description": _NEVER,
        "extract_description": _NEVER,
        "search_content_types": _NOT_SERVED,
        "image_settings": _NOT_SERVED,
        "external_web_access": _NOT_SERVED,
    },
)

CODE_TOOL_SPEC: Final[Spec] = obj(
    {
        "type": enum("code_interpreter"),
        "container": obj({"type": enum("auto")}, required=("type",)),
    },
    required=("type", "container"),
)

_CACHE: Final = {"cache_control": harmless}
WEB_SERVER_TOOL: Final[Spec] = obj(
    {
        "type": string,
        "name": string,
        "max_uses": integer(ge=1),
        "allowed_domains": domain_list,
        "blocked_domains": domain_list,
        "user_location": obj(
            {
                "type": enum("approximate"),
                "city": string,
                "country": string,
                "region": string,
                "timezone": string,
            },
            required=("type",),
        ),
        **_CACHE,
    },
    required=("type",),
)
CODE_SERVER_TOOL: Final[Spec] = obj({"type": string, "name": string, **_CACHE}, required=("type",))


def messages_web_options(tool: dict[str, Any]) -> dict[str, Any]:
    """A Messages web search tool as chat ``web_search_options`` (before the domains)."""
    options: dict[str, Any] = {}
    location = tool.get("user_location")
    if location is not None:
        place = {k: location[k] for k in ("city", "country", "region", "timezone") if k in location}
        options["user_location"] = {"type": "approximate", "approximate": place}
    filters = {k: tool[k] for k in ("allowed_domains", "blocked_domains") if k in tool}
    if filters:
        options["filters"] = filters
    return options


def allowed_domains(caller: Sequence[str] | None, policy: Sequence[str]) -> list[str]:
    """The caller's domains ∩ the policy's patterns, as worker filter names."""
    out: list[str] = []
    if caller is None:
        out = [p.removeprefix("*.") for p in policy]
    else:
        for domain in caller:
            for pattern in policy:
                base = pattern.removeprefix("*.")
                if pattern.startswith("*.") and (domain == base or domain.endswith("." + base)):
                    out.append(domain)  # within the pattern (the base: the worker's reading)
                elif base == domain or base.endswith("." + domain):
                    out.append(base)  # the policy is the narrower
    return list(dict.fromkeys(out))
