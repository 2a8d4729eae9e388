"""Host names as a URL parser sees them, and domain patterns. Pure.

The worker fetches web pages with reqwest, whose URLs follow the WHATWG URL
standard; the gateway decides about the same host only if it reads the host
the same way. So :func:`parse_host` follows WHATWG host parsing for the
``http``/``https`` schemes, and refuses (``ValueError``) wherever it would
have to guess:

* the host text is percent-decoded first (``%31%32%37.0.0.1`` is
  ``127.0.0.1``), and must then be UTF-8;
* a non-ASCII name goes through UTS #46 (non-transitional, as WHATWG: ``ß``
  stays ``ß``, so ``faß.de`` is ``xn--fa-hia.de``, not ``fass.de``); fullwidth
  dots and digits map to ASCII here, so ``127.0.0.1`` spelt in fullwidth
  characters is an IPv4 address;
* an ASCII name is lower-cased; one trailing dot is dropped (``example.com.``
  names ``example.com``); an empty label or any character outside
  ``a-z 0-9 - _`` is refused;
* a name whose last label is a number (decimal, ``0x`` hex, or ``0``-led
  octal) is an IPv4 address in WHATWG's forms (``2130706433``, ``0x7f.1``,
  ``0177.0.0.1``, ``127.1``) or invalid: never a name;
* ``[...]`` is an IPv6 address.

:func:`domain_pattern` normalizes an operator's ``allowed_domains`` entry
(a name, or ``*.`` and a name), refusing addresses; :func:`matches` is the one
comparison: exact, or ``*.suffix`` for names strictly below the suffix.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

import idna

__all__ = ["Address", "Host", "domain_pattern", "ipv4_number", "matches", "parse_host"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL: Final = re.compile(r"[a-z0-9_-]{1,63}")
_MAX_NAME: Final = 253
_DECIMAL: Final = re.compile(r"[0-9]+")
_HEX: Final = re.compile(r"0[xX][0-9a-fA-F]*")
_OCTAL: Final = re.compile(r"0[0-7]+")
#: what UTS #46 maps to a full stop: ASCII, ideographic, fullwidth, halfwidth ideographic
_DOTS: Final = (".", "\u3002", "\uff0e", "\uff61")


@dataclass(frozen=True, slots=True)
class Host:
    """A parsed host: exactly one of ``name`` (ASCII, lower-case, no trailing
    dot) and ``address``."""

    name: str | None = None
    address: Address | None = None


def parse_host(text: str) -> Host:
    """The host of a URL's authority (after userinfo and port are cut off)."""
    if text.startswith("["):
        if not text.endswith("]"):
            raise ValueError("unterminated IPv6 literal")
        return Host(address=ipaddress.IPv6Address(text[1:-1]))
    try:
        decoded = unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("host is not UTF-8") from None
    name = _to_ascii(decoded)
    number = ipv4_number(name)
    if number is not None:
        return Host(address=ipaddress.IPv4Address(number))
    return Host(name=_checked_name(name))


def _to_ascii(text: str) -> str:
    if text.isascii():
        return text.lower()
    try:
        # idna refuses an empty label, so the one trailing dot WHATWG allows is kept aside.
        body, dot = (text[:-1], ".") if text.endswith(_DOTS) else (text, "")
        return idna.encode(body, uts46=True, transitional=False).decode("ascii") + dot
    except (idna.IDNAError, UnicodeError, ValueError):
        raise ValueError("host is not a valid internationalized name") from None


def _checked_name(name: str) -> str:
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > _MAX_NAME:
        raise ValueError("host name is empty or too long")
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError("host name has an empty label or a character names may not have")
    return name


def ipv4_number(host: str) -> int | None:
    """WHATWG's IPv4 reading of an ASCII host: its 32-bit value, ``None`` when
    the host does not end in a number (a name), ``ValueError`` when it does
    but is no valid address (WHATWG then fails the whole URL)."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    last = parts[-1]
    if not (_DECIMAL.fullmatch(last) or _HEX.fullmatch(last)):
        return None
    if len(parts) > 4:
        raise ValueError("more than four IPv4 parts")
    numbers = [_ipv4_part(part) for part in parts]
    *head, tail = numbers
    if any(n > 255 for n in head) or tail >= 256 ** (5 - len(numbers)):
        raise ValueError("an IPv4 part is out of range")
    value = tail
    for index, n in enumerate(head):
        value += n * 256 ** (3 - index)
    return value


def _ipv4_part(part: str) -> int:
    if _HEX.fullmatch(part):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part[0] == "0":
        # A leading zero means octal; "09" is no number at all (WHATWG), not 9.
        if not _OCTAL.fullmatch(part):
            raise ValueError("an IPv4 part is not a valid octal number")
        return int(part[1:], 8)
    if _DECIMAL.fullmatch(part):
        return int(part)
    raise ValueError("an IPv4 part is not a number")


def domain_pattern(text: str) -> str:
    """An ``allowed_domains`` entry normalized: ``name`` or ``*.name``; an
    address in any form, or anything that is not a name, is a ``ValueError``."""
    raw = text.strip()
    wildcard = raw.startswith("*.")
    body = raw[2:] if wildcard else raw
    if "*" in body or "%" in body or ":" in body or body.startswith("["):
        raise ValueError("must be a name or *.name (no other wildcard, no port, no address)")
    host = parse_host(body)
    if host.name is None:
        raise ValueError("is an IP address: allowed_domains lists names only")
    return f"*.{host.name}" if wildcard else host.name


def matches(name: str, pattern: str) -> bool:
    """``name`` (normalized) is ``pattern``, or strictly below a ``*.`` pattern."""
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern
