"""Where a web tool call would fetch: the host of its URL, and of URLs named
inside it (spec §22 "Approvals", rule 2). Pure.

The worker fetches (reference §3.1, ``search/mod.rs``):

* ``mistralrs_website_content_extractor``: its ``url`` argument;
* ``mistralrs_search_the_web``: its ``query`` when, trimmed of whitespace and
  ``"``, it starts with ``http://`` or ``https://``; any other query goes to
  DuckDuckGo's HTML endpoint (:func:`target_url` returns ``None``: the call
  names no fetch target the gateway could judge).

The URL is split as WHATWG (reqwest's parser) splits ``http(s)`` URLs, and
where that would need a guess it is refused instead: C0 controls anywhere
(WHATWG silently drops tabs and newlines), a scheme other than http(s), a
port that is not a number. Any run of ``/`` and ``\\`` follows the scheme;
the authority ends at the first ``/``, ``\\``, ``?`` or ``#``; the host is
what follows its *last* ``@`` (``https://allowed@evil.com`` fetches
``evil.com``; ``https://evil.com#@allowed`` fetches ``evil.com``), read by
``gateway/core/hostnames.py``. An unreadable host is ``address_not_public``
when it reads as an address attempt (brackets, a last label that is a
number), else ``domain_not_allowed``.

URLs named inside the URL (redirectors, proxies: ``?url=http://169.254.169.254``,
``/redirect?to=https://evil.com``, percent-encoded up to three times, or a
query value starting ``//``) are found too, and their hosts must pass the
same host rules (an allowed name, never an address). The URL's own host is
the one resolved and checked for public addresses.

What the gateway cannot see: the worker's fetcher follows HTTP redirects
(reqwest's default policy, up to 10) with no address check, so an allowed
site that redirects -- an open redirect, or a page the site's owner
changes -- leads the worker anywhere, private addresses included; and the
worker resolves the name again itself, so a name whose DNS answer changes
between the gateway's lookup and the worker's (rebinding) is fetched at
the second answer. For a plain search query the worker fetches the pages
DuckDuckGo lists, unchecked (its ``allowed_domains`` filter drops results
only after fetching them). ``allowed_domains`` should therefore name only
sites the operator trusts not to redirect, and the worker should run
where its egress cannot reach private networks (docs/security.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, unquote

from gateway.apis.agents.wire import EXTRACT, SEARCH
from gateway.core.hostnames import Host, parse_host

__all__ = ["TargetRefused", "WebTarget", "parse_target", "target_url"]

Refusal = Literal["domain_not_allowed", "address_not_public"]

_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_C0_AND_SPACE: Final = "".join(chr(c) for c in range(0x21))
_AUTHORITY_END: Final = re.compile(r"[/\\?#]")
_PORT: Final = re.compile(r"[0-9]{0,5}")
_EMBEDDED: Final = re.compile(r"(?i)https?:[/\\]*([^/\\?#\s&\"'<>]+)")
_NUMERIC_LAST: Final = re.compile(r"(?i)(?:^|\.)(?:[0-9]+|0x[0-9a-f]*)\.?$")
_DECODINGS: Final = 3
_MAX_EMBEDDED: Final = 32


class TargetRefused(Exception):
    """The call names a fetch the rules refuse without looking further."""

    def __init__(self, reason: Refusal) -> None:
        self.reason: Refusal = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class WebTarget:
    """A fetch's own host, and the hosts of URLs named inside its URL."""

    host: Host
    embedded: tuple[Host, ...] = ()


def target_url(tool_name: str, arguments: Any) -> str | None:
    """The URL a web tool call fetches, or ``None`` for a plain search query."""
    if tool_name == EXTRACT:
        url = arguments.get("url") if isinstance(arguments, dict) else None
        if not isinstance(url, str):
            raise TargetRefused("domain_not_allowed")
        return url
    if tool_name == SEARCH:
        query = arguments.get("query") if isinstance(arguments, dict) else None
        if not isinstance(query, str):
            raise TargetRefused("domain_not_allowed")
        # Stricter than the worker's one trim and one strip of quotes: whatever
        # it could take for a URL, this takes for one too.
        trimmed = query
        while (stripped := trimmed.strip().strip('"')) != trimmed:
            trimmed = stripped
        if trimmed[:8].lower().startswith(("http://", "https://")):
            return trimmed
        return None
    raise TargetRefused("domain_not_allowed")


def parse_target(url: str) -> WebTarget:
    host_text, rest = _split(url)
    host = _host(host_text)
    embedded = tuple(_host(text) for text in _embedded_authorities(rest))
    return WebTarget(host, embedded)


def _split(url: str) -> tuple[str, str]:
    """(host text, path and query) of an http(s) URL, as WHATWG splits it."""
    text = url.strip(_C0_AND_SPACE)
    scheme = _SCHEME.match(text)
    if _CONTROL.search(text) or scheme is None:
        raise TargetRefused("domain_not_allowed")
    if scheme.group(1).lower() not in ("http", "https"):
        raise TargetRefused("domain_not_allowed")
    rest = text[scheme.end() :].lstrip("/\\")
    end = _AUTHORITY_END.search(rest)
    authority, tail = (rest[: end.start()], rest[end.start() :]) if end else (rest, "")
    host, port = _host_port(authority)
    if not _PORT.fullmatch(port) or (port and int(port) > 65535):
        raise TargetRefused("domain_not_allowed")
    return host, tail.split("#", 1)[0]


def _host_port(authority: str) -> tuple[str, str]:
    """The host and port text of an authority: after its last ``@``; a port
    after the ``]`` of an IPv6 literal, else after the first ``:``."""
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            return hostport, ""
        port = hostport[close + 1 :]
        return hostport[: close + 1], port[1:] if port.startswith(":") else port
    host, _, port = hostport.partition(":")
    return host, port


def _host(text: str) -> Host:
    try:
        return parse_host(text)
    except ValueError:
        looks_numeric = text.startswith("[") or _NUMERIC_LAST.search(unquote(text))
        raise TargetRefused(
            "address_not_public" if looks_numeric else "domain_not_allowed"
        ) from None


def _embedded_authorities(rest: str) -> list[str]:
    """Authorities of URLs named in a path and query, at every decoding depth."""
    found: list[str] = []
    text = rest
    for _ in range(_DECODINGS + 1):
        found += [m.group(1) for m in _EMBEDDED.finditer(text)]
        query = text.partition("?")[2]
        for _, value in parse_qsl(query, keep_blank_values=True):
            stripped = value.strip()
            if stripped.startswith(("//", "\\\\", "/\\", "\\/")):
                found.append(_AUTHORITY_END.split(stripped.lstrip("/\\"), 1)[0])
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    hosts = list(dict.fromkeys(_host_port(a)[0] for a in found))
    if len(hosts) > _MAX_EMBEDDED:
        raise TargetRefused("domain_not_allowed")
    return [h for h in hosts if h]
