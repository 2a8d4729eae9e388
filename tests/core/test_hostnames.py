"""Hosts read as the worker's URL parser (WHATWG) reads them; domain patterns."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.hostnames import Host, domain_pattern, ipv4_number, matches, parse_host


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7F.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0177.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("169.254.169.254.", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("%31%32%37.0.0.1", "127.0.0.1"),
        ("\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("[fd00:ec2::254]", "fd00:ec2::254"),
    ],
)
def test_addresses_in_every_whatwg_form(text: str, address: str) -> None:
    assert parse_host(text) == Host(address=ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("faß.de", "xn--fa-hia.de"),  # non-transitional, as WHATWG: not fass.de
        ("\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45\u3002\uff43\uff4f\uff4d", "example.com"),
        ("_dmarc.example.com", "_dmarc.example.com"),
        ("1.2.3.example", "1.2.3.example"),
        ("0xg.example", "0xg.example"),
    ],
)
def test_names(text: str, name: str) -> None:
    assert parse_host(text) == Host(name=name)


@pytest.mark.parametrize(
    "text",
    [
        "",
        ".",
        "a..b",
        "example.com..",
        "09.1.1.1",  # leading zero: octal, and 9 is no octal digit
        "1.2.3.4.5",
        "256.0.0.1",
        "1.16777216",
        "4294967296",
        "a.1",
        "exa mple.com",
        "exa%20mple.com",
        "%ff.com",
        "a!b.com",
        "[::1",
        "[nothing]",
        "x" * 64 + ".com",
    ],
)
def test_refused_hosts(text: str) -> None:
    with pytest.raises(ValueError):
        parse_host(text)


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_ipv4_spelling_reads_back(value: int) -> None:
    dotted = str(ipaddress.IPv4Address(value))
    octets = [int(p) for p in dotted.split(".")]
    assert ipv4_number(dotted) == value
    assert ipv4_number(str(value)) == value
    assert ipv4_number(hex(value)) == value
    assert ipv4_number(".".join(f"0{o:o}" if o else "0" for o in octets)) == value
    short = f"{octets[0]}.{value & 0xFFFFFF}"
    assert ipv4_number(short) == value


def test_names_do_not_end_in_a_number() -> None:
    assert ipv4_number("example.com") is None
    assert ipv4_number("1.2.3.example") is None


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("docs.example.com", "docs.example.com", True),
        ("docs.example.com", "a.docs.example.com", False),
        ("*.wikipedia.org", "en.wikipedia.org", True),
        ("*.wikipedia.org", "a.b.wikipedia.org", True),
        ("*.wikipedia.org", "wikipedia.org", False),
        ("*.wikipedia.org", "evilwikipedia.org", False),
        ("*.wikipedia.org", "wikipedia.org.evil.com", False),
        ("example.com", "example.com.evil.com", False),
    ],
)
def test_matches(pattern: str, name: str, expected: bool) -> None:
    assert matches(name, domain_pattern(pattern)) is expected


@pytest.mark.parametrize("entry", ["10.0.0.1", "*.127.1", "::1", "[::1]", "*", "a.*.com", "x:1"])
def test_domain_patterns_are_names_only(entry: str) -> None:
    with pytest.raises(ValueError):
        domain_pattern(entry)
