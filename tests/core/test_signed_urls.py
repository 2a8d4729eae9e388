"""Signed, expiring file links (spec §23): HMAC over the file id and exp, constant-time
compared, refused at or after exp, every refusal the same."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs, urlsplit

import pytest

from gateway.core.signed_urls import LinkSigner, check, link, signature

KEY = b"0123456789abcdef0123456789abcdef"
FILE = "file_AbCdEf0123456789-_xy"


def _parts(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    return parts.path.split("/")[3], query["sig"][0], query["exp"][0]


def test_the_link_is_the_spec_shape_and_its_signature_the_hmac() -> None:
    url = link("https://gw.example.com", KEY, FILE, 1_700_003_600)
    assert url.startswith(f"https://gw.example.com/v1/files/{FILE}/content?sig=")
    file_id, sig, exp = _parts(url)
    assert (file_id, exp) == (FILE, "1700003600")
    expected = hmac.new(KEY, f"{FILE}\n1700003600".encode(), hashlib.sha256).hexdigest()
    assert sig == expected == signature(KEY, FILE, 1_700_003_600)


def test_a_link_opens_until_exp_and_not_at_it() -> None:
    sig = signature(KEY, FILE, 1000)
    assert check(KEY, FILE, sig, "1000", now=999.9)
    assert not check(KEY, FILE, sig, "1000", now=1000)
    assert not check(KEY, FILE, sig, "1000", now=5000)


@pytest.mark.parametrize(
    ("file_id", "sig_of", "exp"),
    [
        ("file_AbCdEf0123456789-_xz", FILE, "1000"),  # another file
        (FILE, FILE, "1001"),  # a later exp than signed
        (FILE, FILE, "+1000"),
        (FILE, FILE, " 1000"),
        (FILE, FILE, "1000.0"),
        (FILE, FILE, "9" * 13),
        (FILE, FILE, ""),
        ("../etc/passwd", "../etc/passwd", "1000"),
    ],
)
def test_anything_changed_is_refused(file_id: str, sig_of: str, exp: str) -> None:
    sig = hmac.new(KEY, f"{sig_of}\n1000".encode(), hashlib.sha256).hexdigest()
    assert not check(KEY, file_id, sig, exp, now=0)


@pytest.mark.parametrize("sig", ["", "0" * 64, "A" * 64, "zz", "0" * 63])
def test_malformed_or_forged_signatures_are_refused(sig: str) -> None:
    assert not check(KEY, FILE, sig, "1000", now=0)


def test_another_key_does_not_open_it() -> None:
    sig = signature(KEY, FILE, 1000)
    assert not check(b"x" * 32, FILE, sig, "1000", now=0)


def test_keys_are_at_least_32_bytes_and_links_need_a_base_url() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        signature(b"short", FILE, 1)
    with pytest.raises(ValueError, match="32 bytes"):
        LinkSigner("https://gw", b"short", 60)
    with pytest.raises(ValueError, match="public_base_url"):
        LinkSigner(None, KEY, 60).link(FILE)
    with pytest.raises(ValueError, match="file id"):
        link("https://gw", KEY, "file/../x", 1)


def test_the_signer_uses_its_ttl_and_clock() -> None:
    clock = [1000.0]
    signer = LinkSigner("https://gw", KEY, 60, clock=lambda: clock[0])
    file_id, sig, exp = _parts(signer.link(FILE))
    assert exp == "1060" and signer.opens(file_id, sig, exp)
    clock[0] = 1060.0
    assert not signer.opens(file_id, sig, exp)
