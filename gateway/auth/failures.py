"""Why authentication failed, as one word of a fixed set (a metric label, a log field).

Callers always get the generic ``missing_credentials`` or ``invalid_token``
with its fixed message; operators get the reason, from
``gateway_auth_failures_total{reason}`` and one log line per failure. The
reason is read from the :class:`TokenRejected` cause that ``tokens.py`` and
``apikeys.py`` chain under every ``invalid_token``, and folded onto
:data:`REASONS`, so the label set stays fixed whatever words the verifier
uses. Pure: no I/O.
"""

from __future__ import annotations

from types import MappingProxyType

from gateway.auth.tokens import TokenRejected
from gateway.core.errors import GatewayError
from gateway.observe.metrics import AUTH_REASONS

#: every label value of gateway_auth_failures_total (defined beside the metric)
REASONS = AUTH_REASONS

#: TokenRejected.reason -> the reason reported; anything unlisted is "malformed"
_BY_REJECTION = MappingProxyType(
    {
        "expired": "expired",
        "not_yet_valid": "not_yet_valid",
        "issued_in_future": "not_yet_valid",  # iat ahead of now
        "audience": "audience",
        "issuer": "issuer",
        "unknown_issuer": "issuer",  # iss names no configured issuer
        "signature": "signature",
        "weak_key": "signature",  # the key is too short to trust the signature
        "unknown_key": "unknown_kid",
        "algorithm": "algorithm",
        "lifetime": "lifetime",
        "missing_exp": "missing_claim",
        "missing_iss": "missing_claim",
        "missing_aud": "missing_claim",
        "missing_tenant": "missing_claim",
        "missing_claim": "missing_claim",
        "unknown_api_key": "unknown_api_key",
        # malformed: bad JSON/base64, a wrongly typed claim (bad_exp, bad_sub,
        # bad_scope…), a critical header, an over-long bearer value
    }
)


def failure_reason(exc: GatewayError) -> str | None:
    """The reason an authentication error is counted under; None for any other error."""
    if exc.code == "missing_credentials":
        return "missing"
    if exc.code != "invalid_token":
        return None
    cause = exc.__cause__
    word = cause.reason if isinstance(cause, TokenRejected) else ""
    return _BY_REJECTION.get(word, "malformed")
