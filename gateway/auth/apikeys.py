"""Static API keys: only their SHA-256 is configured (spec §4).

The presented key is hashed once and compared against every configured
digest with ``hmac.compare_digest``, without stopping at a match, so the
time taken does not depend on which entry (if any) matched.
"""

from __future__ import annotations

import hashlib
import hmac

from gateway.auth.principal import Principal
from gateway.auth.tokens import TokenRejected
from gateway.config.policy import PolicySet
from gateway.core.errors import GatewayError


def match_api_key(value: str, policies: PolicySet) -> Principal:
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
    matched = None
    for configured, entry in policies.api_keys.items():
        if hmac.compare_digest(digest, configured):
            matched = entry
    if matched is None:
        raise GatewayError("invalid_token") from TokenRejected("unknown_api_key")
    return Principal(
        tenant=matched.tenant,
        subject=f"apikey:{matched.name}",
        # its entry's (both API scopes unless listed); the endpoints still limit it
        scopes=matched.scopes,
        kind="api_key",
        expires_at=None,
    )
