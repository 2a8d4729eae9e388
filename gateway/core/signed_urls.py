"""Signed, expiring links to a tenant file (spec §23 ``response_format: url``). Pure.

A link is ``<public base URL>/v1/files/<id>/content?sig=<HMAC>&exp=<unix>``
and works without credentials until ``exp``. Rules:

- ``sig`` is the lowercase hex HMAC-SHA256, under the gateway's link key, of
  ``"<file id>\\n<exp>"``: one file, one expiry; nothing else in the URL is
  trusted (a changed id or ``exp`` breaks the signature).
- :func:`check` compares in constant time (``hmac.compare_digest``), takes
  ``exp`` only as a plain decimal of at most 12 digits (no sign, no spaces)
  and refuses a link at or after its ``exp``. Every refusal is the same
  ``False``: a caller learns nothing about which part was wrong.
- The key is at least :data:`MIN_KEY_BYTES` bytes; a file id is what the file
  store made (``file_`` and URL-safe characters), so it needs no escaping.

:class:`LinkSigner` is the gateway's: its base URL, key and TTL, and a clock.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable

MIN_KEY_BYTES = 32
_EXP = re.compile(r"[0-9]{1,12}")
_SIG = re.compile(r"[0-9a-f]{64}")
FILE_ID = re.compile(r"file_[A-Za-z0-9_-]{8,64}")


def signature(key: bytes, file_id: str, exp: int) -> str:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a link key needs at least {MIN_KEY_BYTES} bytes")
    message = f"{file_id}\n{exp}".encode("ascii")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def link(base_url: str, key: bytes, file_id: str, exp: int) -> str:
    """The file's signed link, valid until ``exp`` (unix seconds)."""
    if FILE_ID.fullmatch(file_id) is None:
        raise ValueError("not a file id")
    return f"{base_url}/v1/files/{file_id}/content?sig={signature(key, file_id, exp)}&exp={exp}"


def check(key: bytes, file_id: str, sig: str, exp: str, now: float) -> bool:
    """Whether ``sig`` and ``exp`` (as the query gave them) open ``file_id`` at ``now``."""
    if _EXP.fullmatch(exp) is None or _SIG.fullmatch(sig) is None:
        return False
    if FILE_ID.fullmatch(file_id) is None:
        return False
    expected = signature(key, file_id, int(exp))
    # Compared before the clock, so a stale link costs what a forged one does.
    valid = hmac.compare_digest(expected, sig)
    return valid and now < int(exp)


class LinkSigner:
    """The gateway's links: its public base URL, its key, how long a link lives."""

    __slots__ = ("_base_url", "_clock", "_key", "ttl_s")

    def __init__(
        self,
        base_url: str | None,
        key: bytes,
        ttl_s: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        signature(key, "file_check", 0)  # refuses a short key now, not at the first link
        self._base_url = base_url
        self._key = key
        self.ttl_s = ttl_s
        self._clock = clock

    def link(self, file_id: str) -> str:
        if self._base_url is None:
            raise ValueError("links need server.public_base_url")
        return link(self._base_url, self._key, file_id, int(self._clock()) + self.ttl_s)

    def opens(self, file_id: str, sig: str, exp: str) -> bool:
        return check(self._key, file_id, sig, exp, self._clock())
