"""Which addresses a web fetch may reach: public ones only (spec §22 rule 2). Pure.

An explicit table (IANA's special-purpose registries), not ``ipaddress``'s
``is_global``, whose answers changed between Python releases. Not public:

* IPv4: this network 0/8, private 10/8, 172.16/12, 192.168/16, CGNAT
  100.64/10, loopback 127/8, link-local 169.254/16 (the cloud metadata
  address 169.254.169.254 among them), IETF 192.0.0/24, documentation
  192.0.2/24, 198.51.100/24, 203.0.113/24, benchmarking 198.18/15, 6to4
  relay 192.88.99/24, AS112 192.31.196/24 and 192.175.48/24, AMT
  192.52.193/24, multicast 224/4, reserved 240/4 and broadcast;
* IPv6: anything outside global unicast 2000::/3 (unspecified, loopback,
  unique-local fc00::/7 with the metadata address fd00:ec2::254, link-local,
  site-local, multicast, discard 100::/64…), and inside it the IETF block
  2001::/23 (Teredo among it), documentation 2001:db8::/32 and 3fff::/20;
* addresses that carry an IPv4 address are judged by it: IPv4-mapped
  ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96`` and 6to4 ``2002::/16``
  (``::ffff:169.254.169.254`` is the metadata address; the local-use NAT64
  prefix 64:ff9b:1::/48 is not public);
* known metadata endpoints on public addresses: Azure's 168.63.129.16.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Final

from gateway.core.hostnames import Address

__all__ = ["all_public", "is_public"]

_V4: Final = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.31.196.0/24",
        "192.52.193.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "192.175.48.0/24",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
)
_V6_UNICAST: Final = ipaddress.IPv6Network("2000::/3")
_V6: Final = tuple(ipaddress.IPv6Network(n) for n in ("2001::/23", "2001:db8::/32", "3fff::/20"))
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_METADATA: Final = frozenset({ipaddress.IPv4Address("168.63.129.16")})


def is_public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            return is_public(embedded)
        plain = ipaddress.IPv6Address(int(address))  # without a zone id
        return plain in _V6_UNICAST and not any(plain in net for net in _V6)
    return address not in _METADATA and not any(address in net for net in _V4)


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if ipaddress.IPv6Address(int(address)) in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def all_public(addresses: Iterable[Address]) -> bool:
    """Every address is public (and there is one at least)."""
    found = False
    for address in addresses:
        if not is_public(address):
            return False
        found = True
    return found
