"""The approval rules (spec §22 "Approvals", §24): tools, web targets, and the
addresses the edge resolved -- each SSRF trick its own test."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from gateway.apis.agents import AgentRules, ApprovalRequired, Decision, decide, deny
from gateway.apis.agents.addresses import all_public, is_public
from gateway.config import PolicyAgents, RouteAgents

RULES = AgentRules(
    tools=("web_search", "python", "mcp:docs_*"),
    allowed_domains=("docs.example.com", "*.wikipedia.org", "xn--bcher-kva.de", "localhost"),
    mcp_prefixes=("docs", "wiki"),
)
PUBLIC = [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("2606:2800:220:1::1")]


def call(
    kind: str = "web_search",
    name: str = "mistralrs_website_content_extractor",
    arguments: Any = None,
    label: str | None = None,
) -> ApprovalRequired:
    return ApprovalRequired(
        round=0,
        approval_id="appr_" + "0" * 32,
        session_id="gs_x",
        tool_name=name,
        kind=kind,
        label=label if label is not None else name,
        source="built_in",
        arguments=arguments,
        arguments_json=b"{}",
    )


def fetch(url: str) -> ApprovalRequired:
    return call(arguments={"url": url})


def search(query: str) -> ApprovalRequired:
    return call(name="mistralrs_search_the_web", arguments={"query": query})


def addr(*texts: str) -> list[Any]:
    return [ipaddress.ip_address(t) for t in texts]


def verdict(c: ApprovalRequired, addresses: list[Any] | None = None) -> tuple[str, str | None]:
    d = decide(RULES, c, addresses)
    return d.verdict, d.reason


# --- 1. the tool ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "kind"),
    [
        (call("code_execution", "mistralrs_execute_python", {"code": "1"}), "python"),
        (call("code_execution", "mistralrs_reset_python_session", {}), "python"),
        (call("file", "mistralrs_read_file", {"file_id": "x"}), "python"),
        (call("custom", "docs_search", {"q": 1}), "mcp"),
        (search("what is sse"), "web_search"),
    ],
)
def test_allowed_tools_are_approved_with_their_policy_word(c: ApprovalRequired, kind: str) -> None:
    assert decide(RULES, c) == Decision("approve", kind=kind)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "c",
    [
        call("shell", "mistralrs_shell", {"commands": ["id"]}),
        call("external", "get_weather", {}),
        call("custom", "get_weather", {}),  # a client function: no MCP prefix
        call("custom", "wiki_search", {}),  # an MCP prefix, but no policy glob for it
        call("custom", "documents_x", {}),  # "docs" is a prefix only with its "_"
        call("teleport", "x", {}),
        call("web_search", "mistralrs_other_web_tool", {"url": "https://docs.example.com"}),
    ],
)
def test_other_tools_are_not_allowed(c: ApprovalRequired) -> None:
    assert decide(RULES, c).reason == "tool_not_allowed"


def test_a_tool_the_policy_lacks_is_not_allowed() -> None:
    rules = AgentRules(tools=("python",), allowed_domains=(), mcp_prefixes=())
    assert decide(rules, search("x")) == deny("tool_not_allowed", "web_search")
    assert decide(rules, call("custom", "docs_search", {})).reason == "tool_not_allowed"


def test_mcp_globs_match_tool_names_case_sensitively() -> None:
    rules = AgentRules(tools=("mcp:docs_get_*",), mcp_prefixes=("docs",))
    assert decide(rules, call("custom", "docs_get_page", {})).verdict == "approve"
    assert decide(rules, call("custom", "docs_put_page", {})).reason == "tool_not_allowed"
    assert decide(rules, call("custom", "docs_GET_page", {})).reason == "tool_not_allowed"


def test_rules_keep_only_tools_the_route_runs() -> None:
    policy = PolicyAgents.model_validate(
        {
            "tools": ["web_search", "python", "mcp:docs_*"],
            "web": {"allowed_domains": ["docs.example.com"]},
        }
    )
    route = RouteAgents(python=True)
    rules = AgentRules.build(policy, route)
    assert rules == AgentRules(("python",), ("docs.example.com",), ())
    full = AgentRules.build(
        policy, RouteAgents(web_search=True, mcp_config="/m.json", mcp_prefixes=["docs"])
    )
    assert full.tools == ("web_search", "mcp:docs_*") and full.mcp_prefixes == ("docs",)


# --- 2. the web target ------------------------------------------------------------------


def test_an_allowed_name_is_resolved_then_approved_when_public() -> None:
    first = decide(RULES, fetch("https://docs.example.com/guide?x=1#part"))
    assert first == Decision("resolve", kind="web_search", host="docs.example.com")
    assert decide(RULES, fetch("https://docs.example.com/guide"), PUBLIC) == Decision(
        "approve", kind="web_search", host="docs.example.com"
    )


def test_a_plain_search_query_names_no_target() -> None:
    assert verdict(search("how does sse reconnect")) == ("approve", None)
    assert verdict(search("10.0.0.1 meaning")) == ("approve", None)


def test_a_search_query_that_is_a_url_is_a_target() -> None:
    assert verdict(search("https://169.254.169.254/latest/meta-data/")) == (
        "deny",
        "address_not_public",
    )
    assert verdict(search('  "https://evil.com/"  ')) == ("deny", "domain_not_allowed")
    assert verdict(search('"\u3000HTTP://evil.com"')) == ("deny", "domain_not_allowed")
    assert verdict(search("https://docs.example.com/x")) == ("resolve", None)


def test_ip_literal() -> None:
    assert verdict(fetch("http://10.0.0.1/")) == ("deny", "address_not_public")
    assert verdict(fetch("http://93.184.216.34/")) == ("deny", "address_not_public")


def test_decimal_ip() -> None:
    assert verdict(fetch("http://2130706433/")) == ("deny", "address_not_public")


@pytest.mark.parametrize(
    "url",
    [
        "http://0x7f.1/",
        "http://0x7f000001/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://0/",
        "http://%31%32%37.0.0.1/",
        "http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11/",
        "http://1.2.3.4.5/",
        "http://09.0.0.1/",
    ],
)
def test_hex_octal_short_and_encoded_ips(url: str) -> None:
    assert verdict(fetch(url)) == ("deny", "address_not_public")


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:169.254.169.254]:80/",
        "http://[fd00:ec2::254]/",
        "http://[2606:2800:220:1::1]/",
        "http://[::1/",
    ],
)
def test_ipv6_literals(url: str) -> None:
    assert verdict(fetch(url)) == ("deny", "address_not_public")


def test_localhost() -> None:
    rules = AgentRules(("web_search",), ("docs.example.com",))
    assert decide(rules, fetch("http://localhost:8080/")).reason == "domain_not_allowed"
    # Even where an operator listed it, its addresses are not public.
    assert verdict(fetch("http://localhost/"), addr("127.0.0.1", "::1")) == (
        "deny",
        "address_not_public",
    )


def test_a_name_resolved_to_loopback() -> None:
    assert verdict(fetch("https://docs.example.com/"), addr("127.0.0.1")) == (
        "deny",
        "address_not_public",
    )


def test_a_name_resolved_to_the_metadata_address() -> None:
    for metadata in ("169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"):
        assert verdict(fetch("https://docs.example.com/"), addr(metadata)) == (
            "deny",
            "address_not_public",
        )


def test_a_mixed_public_and_private_resolution() -> None:
    mixed = [*PUBLIC, *addr("10.1.2.3")]
    assert verdict(fetch("https://docs.example.com/"), mixed) == ("deny", "address_not_public")


def test_a_name_that_did_not_resolve() -> None:
    assert decide(RULES, fetch("https://docs.example.com/"), []) == Decision(
        "deny", "unresolvable", "web_search", "docs.example.com"
    )


def test_userinfo_names_the_real_host_after_it() -> None:
    assert verdict(fetch("https://docs.example.com@evil.com/")) == ("deny", "domain_not_allowed")
    assert verdict(fetch("https://docs.example.com:pw@evil.com/")) == (
        "deny",
        "domain_not_allowed",
    )
    assert verdict(fetch("https://a@b@evil.com/")) == ("deny", "domain_not_allowed")
    assert verdict(fetch("https://evil.com@docs.example.com/")) == ("resolve", None)


def test_a_fragment_is_not_the_host() -> None:
    assert verdict(fetch("https://evil.com#@docs.example.com")) == ("deny", "domain_not_allowed")
    assert verdict(fetch("https://evil.com?@docs.example.com")) == ("deny", "domain_not_allowed")


def test_backslashes_end_the_authority_as_whatwg_reads_them() -> None:
    # WHATWG: https://docs.example.com\@evil.com is host docs.example.com, path /@evil.com
    assert decide(RULES, fetch("https://docs.example.com\\@evil.com/")).host == "docs.example.com"
    assert verdict(fetch("https:\\\\evil.com\\")) == ("deny", "domain_not_allowed")


def test_a_suffix_is_not_the_domain() -> None:
    assert verdict(fetch("https://docs.example.com.evil.com/")) == ("deny", "domain_not_allowed")
    assert verdict(fetch("https://evildocs.example.com/")) == ("deny", "domain_not_allowed")
    assert verdict(fetch("https://wikipedia.org/")) == ("deny", "domain_not_allowed")
    assert verdict(fetch("https://en.wikipedia.org.evil.com/")) == ("deny", "domain_not_allowed")
    assert verdict(fetch("https://en.wikipedia.org/wiki/SSE")) == ("resolve", None)


def test_a_trailing_dot() -> None:
    assert decide(RULES, fetch("https://docs.example.com./")).host == "docs.example.com"
    assert verdict(fetch("https://docs.example.com../")) == ("deny", "domain_not_allowed")


def test_uppercase() -> None:
    assert decide(RULES, fetch("HTTPS://DOCS.EXAMPLE.COM/A")).host == "docs.example.com"


def test_idn() -> None:
    assert decide(RULES, fetch("https://bücher.de/")).host == "xn--bcher-kva.de"
    assert decide(RULES, fetch("https://BÜCHER.de/")).host == "xn--bcher-kva.de"
    assert decide(RULES, fetch("https://xn--bcher-kva.de/")).host == "xn--bcher-kva.de"
    assert verdict(fetch("https://bucher.de/")) == ("deny", "domain_not_allowed")
    # fullwidth letters map to ASCII (UTS #46), so this is docs.example.com
    wide = "\uff44\uff4f\uff43\uff53.example.com"
    assert decide(RULES, fetch(f"https://{wide}/")).host == "docs.example.com"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://docs.example.com/",
        "file:///etc/passwd",
        "gopher://docs.example.com/",
        "javascript:alert(1)",
        "docs.example.com/page",
        "//docs.example.com/",
        "https://docs.example.com:99999/",
        "https://docs.example.com:8o/",
        "https://docs.exa\tmple.com/",
        "https://docs.example.com/\npath",
        "https:///",
        "",
    ],
)
def test_urls_that_need_a_guess_are_refused(url: str) -> None:
    assert verdict(fetch(url)) == ("deny", "domain_not_allowed")


def test_arguments_without_a_url() -> None:
    assert verdict(call(arguments={"link": "https://docs.example.com"})) == (
        "deny",
        "domain_not_allowed",
    )
    assert verdict(call(arguments="https://docs.example.com")) == ("deny", "domain_not_allowed")
    assert verdict(call(name="mistralrs_search_the_web", arguments=None)) == (
        "deny",
        "domain_not_allowed",
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (
            "https://docs.example.com/redirect?url=http://169.254.169.254/latest",
            "address_not_public",
        ),
        ("https://docs.example.com/r?to=https://evil.com/", "domain_not_allowed"),
        ("https://docs.example.com/r?to=https%3A%2F%2Fevil.com%2F", "domain_not_allowed"),
        ("https://docs.example.com/r?to=https%253A%252F%252F10.0.0.1", "address_not_public"),
        ("https://docs.example.com/r?next=//evil.com/x", "domain_not_allowed"),
        ("https://docs.example.com/r?next=%2F%2Fevil.com", "domain_not_allowed"),
        ("https://docs.example.com/proxy/http://evil.com/", "domain_not_allowed"),
        ("https://docs.example.com/r?u=HTTP://[::1]/", "address_not_public"),
        ("https://docs.example.com/r?u=http://user@2130706433/", "address_not_public"),
    ],
)
def test_urls_named_inside_the_url(url: str, reason: str) -> None:
    assert verdict(fetch(url), PUBLIC) == ("deny", reason)


def test_urls_named_inside_may_name_allowed_hosts() -> None:
    url = "https://docs.example.com/r?to=https://en.wikipedia.org/wiki/X#https://evil.com"
    assert verdict(fetch(url), PUBLIC) == ("approve", None)


# --- decisions on the wire ------------------------------------------------------------


def test_decision_bodies_name_the_rule_and_never_remember() -> None:
    denied = decide(RULES, fetch("https://evil.com/"))
    assert denied.body() == {
        "decision": "deny",
        "message": "Denied by the gateway (domain_not_allowed): the web host is not on this "
        "tenant's allowed list.",
    }
    assert decide(RULES, search("x")).body() == {
        "decision": "approve",
        "message": "Approved by the gateway.",
    }
    assert (
        deny("caller_denied", "python")
        .body()["message"]
        .startswith("Denied by the gateway (caller_denied)")
    )
    with pytest.raises(ValueError):
        decide(RULES, fetch("https://docs.example.com/")).body()


def test_denial_messages_never_echo_the_target() -> None:
    secret_path = "https://evil.com/?token=sk-123"
    assert "sk-123" not in decide(RULES, fetch(secret_path)).message
    assert "evil" not in decide(RULES, fetch(secret_path)).message


# --- addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "0.0.0.0",
        "10.1.2.3",
        "100.64.0.1",
        "100.100.100.200",
        "127.0.0.1",
        "169.254.169.254",
        "172.16.0.1",
        "172.31.255.255",
        "192.0.0.192",
        "192.0.2.1",
        "192.168.1.1",
        "198.18.0.1",
        "198.51.100.1",
        "203.0.113.1",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "168.63.129.16",
        "::",
        "::1",
        "::ffff:10.0.0.1",
        "::ffff:127.0.0.1",
        "::127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::1",
        "2002:a9fe:a9fe::1",
        "2001::1",
        "2001:db8::1",
        "fc00::1",
        "fd00:ec2::254",
        "fe80::1",
        "fe80::1%eth0",
        "fec0::1",
        "ff02::1",
        "100::1",
    ],
)
def test_addresses_that_are_not_public(text: str) -> None:
    assert not is_public(ipaddress.ip_address(text))


@pytest.mark.parametrize(
    "text",
    [
        "1.1.1.1",
        "8.8.8.8",
        "93.184.216.34",
        "172.32.0.1",
        "100.128.0.1",
        "2606:4700:4700::1111",
        "2a00:1450:4001:81c::200e",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ],
)
def test_public_addresses(text: str) -> None:
    assert is_public(ipaddress.ip_address(text))


def test_all_public_needs_one_address_at_least() -> None:
    assert not all_public([])
    assert all_public(PUBLIC)
