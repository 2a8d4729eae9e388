"""The worker's session ids (spec §22 "Requests", §24 "sessions"). Pure.

The worker keys its agentic sessions (history splicing, remembered
approvals) by a bare caller-chosen ``session_id`` shared by every client
(reference §3.3). The gateway never forwards a caller's id: it forwards
``"gs_" + hex(HMAC-SHA256(key, tenant + "\\n" + caller's id))[:32]``, so one
tenant's id can never name another tenant's session (a tenant name holds no
newline, so the pair is read one way only), and a caller who sent none gets a
fresh random id of the same shape (and none back). The key is gateway config
``agents.session_key_env`` (≥ 32 bytes, checked by ``check``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["SESSION_PREFIX", "fresh_session_id", "worker_session_id"]

SESSION_PREFIX = "gs_"
_HEX_CHARS = 32


def worker_session_id(key: bytes, tenant: str, caller_id: str) -> str:
    """The worker's session id for a caller's (128 bits of the HMAC, in hex)."""
    message = f"{tenant}\n{caller_id}".encode("utf-8", "surrogatepass")
    digest = hmac.new(key, message, hashlib.sha256).hexdigest()
    return SESSION_PREFIX + digest[:_HEX_CHARS]


def fresh_session_id() -> str:
    """A session of its own for a caller that named none (128 random bits)."""
    return SESSION_PREFIX + secrets.token_hex(_HEX_CHARS // 2)
