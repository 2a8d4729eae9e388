"""Which configured SHA-256 digests are placeholders, not digests of anything.

A pinned digest (``launch.binary_sha256``, ``launch.model_bundle_sha256``, a
policy's ``api_keys[].sha256``) is valid hex by type; this tells the ones an
operator typed in as filler apart from real ones. The rule, exactly
(``placeholder_reason``): a 64-hex value is a placeholder when

1. it is the SHA-256 of zero bytes (``e3b0c442…b855``: a digest of an empty
   file or an empty key),
2. it repeats a pattern of at most 16 hex digits (``0000…``, ``ffff…``,
   ``deadbeef`` 8 times, ``0123456789abcdef`` 4 times),
3. it uses fewer than 8 distinct hex digits (a real digest uses about 16;
   the odds of fewer than 8 are below 1e-22), or
4. it starts with a well-known filler word (``deadbeef``, ``cafebabe``,
   ``feedface``, ``baadf00d``, ``8badf00d``; odds about 1e-9 for a real one).

A placeholder is a warning, never an error: the value is well-formed and
some test setups use one on purpose. Pure: no I/O.
"""

from __future__ import annotations

import hashlib

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
FILLER_WORDS = ("deadbeef", "cafebabe", "feedface", "baadf00d", "8badf00d")
MAX_PERIOD = 16
MIN_DISTINCT = 8


def _period(value: str) -> int:
    """The length of the shortest pattern whose repetition is ``value``."""
    for size in range(1, len(value)):
        if len(value) % size == 0 and value[:size] * (len(value) // size) == value:
            return size
    return len(value)


def placeholder_reason(digest: str) -> str | None:
    """Why ``digest`` looks like filler (a fixed phrase), or None for a real-looking one."""
    value = digest.lower()
    if value == EMPTY_SHA256:
        return "is the SHA-256 of zero bytes"
    if _period(value) <= MAX_PERIOD:
        return "repeats a short pattern"
    if len(set(value)) < MIN_DISTINCT:
        return f"uses fewer than {MIN_DISTINCT} distinct hex digits"
    for word in FILLER_WORDS:
        if value.startswith(word):
            return f"starts with the filler word {word!r}"
    return None
