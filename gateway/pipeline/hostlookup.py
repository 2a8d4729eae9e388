"""Where a web fetch would go: a name's addresses, pinned first, then DNS, bounded (spec §22, §24).

The approval rules (``gateway/apis/agents/rules.py``) decide on addresses;
this only finds them. ``agents.hosts`` answers before DNS (pinning,
air-gapped sites, tests). A name that does not resolve within
:data:`RESOLVE_S` has no address, which the rules deny ``unresolvable``: a
slow resolver costs the tool call, never the stream. The worker resolves
the name again when it fetches (DNS rebinding is the worker's egress
policy's to stop: ``docs/agents.md``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping, Sequence

from gateway.core.hostnames import Address

#: the longest a name may take to resolve (spec §24)
RESOLVE_S = 2.0


class HostLookup:
    def __init__(self, pinned: Mapping[str, Sequence[Address]], timeout_s: float = RESOLVE_S):
        self._pinned = {name.lower(): list(addresses) for name, addresses in pinned.items()}
        self._timeout_s = timeout_s

    async def addresses(self, name: str) -> list[Address]:
        pinned = self._pinned.get(name.lower())
        if pinned is not None:
            return list(pinned)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_s):
                infos = await loop.getaddrinfo(name, 443, type=socket.SOCK_STREAM)
        except (TimeoutError, OSError, UnicodeError):
            return []
        found: dict[str, Address] = {}
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                # An IPv6 sockaddr may carry a zone (fe80::1%eth0): drop it.
                text = str(sockaddr[0]).split("%", 1)[0]
                found.setdefault(text, ipaddress.ip_address(text))
        return list(found.values())
