"""JWT verification: signature and claims with pyjwt, time with our clock.

Theory of operation: the unverified ``iss`` only *routes* the token to one
configured issuer; nothing else is read before the signature is checked.
The header ``alg`` must be in that issuer's allowlist and have a key bound to
exactly that algorithm (see ``keys.py``). pyjwt checks the signature, ``iss``,
``aud`` and the presence of ``exp``/``iss``/``aud``; ``exp``, ``nbf``, ``iat``
and the lifetime cap are checked here against the injected clock, so tests
and the cache agree on one notion of "now".

Every refusal is ``GatewayError("invalid_token")`` with the fixed default
message. The reason is chained as a :class:`TokenRejected` cause carrying a
fixed word, for logs and tests; no token or claim value is ever put in an
error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import jwt
from jwt import (
    DecodeError,
    InvalidAlgorithmError,
    InvalidAudienceError,
    InvalidIssuerError,
    InvalidKeyError,
    InvalidSignatureError,
    MissingRequiredClaimError,
    PyJWTError,
)
from jwt.exceptions import InvalidSubjectError

from gateway.auth.keys import IssuerKeys, KeySet
from gateway.auth.principal import Principal
from gateway.config import IssuerConfig
from gateway.core.errors import GatewayError

#: three base64url segments; the signature may be empty (``alg: none``) so
#: such tokens are refused as JWTs rather than treated as API keys
JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_REQUIRED = ["exp", "iss", "aud"]


class TokenRejected(Exception):
    """The cause chained under an ``invalid_token`` error; ``reason`` is a fixed word."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class UnknownKey(Exception):
    """The token names a key its (refreshable) issuer does not have (yet)."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        super().__init__("unknown kid")


def reject(reason: str) -> NoReturn:
    raise GatewayError("invalid_token") from TokenRejected(reason)


@dataclass(frozen=True, slots=True)
class Routed:
    """A token's unverified header fields and the issuer its ``iss`` names."""

    issuer: IssuerKeys
    alg: str
    kid: str | None


def route(token: str, keys: KeySet) -> Routed:
    """Pick the issuer by the unverified ``iss``; read ``alg`` and ``kid``."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except PyJWTError:
        reject("malformed")
    iss = unverified.get("iss")
    if not isinstance(iss, str):
        reject("missing_iss")
    issuer = keys.get(iss)
    if issuer is None:
        reject("unknown_issuer")
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or alg not in issuer.config.algorithms:
        reject("algorithm")
    if kid is not None and not isinstance(kid, str):
        reject("malformed")
    if "crit" in header or "b64" in header:
        # No extension is understood here, so none may be marked critical.
        reject("header")
    return Routed(issuer, alg, kid)


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        reject(f"bad_{name}")
    return float(value)


def _scopes(value: object) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return frozenset(value)
    reject("bad_scope")


def verify(token: str, routed: Routed, now: float) -> Principal:
    """Verify a routed token; raise UnknownKey when its kid may appear on refresh."""
    issuer = routed.issuer
    config = issuer.config
    key = issuer.find(routed.kid)
    if key is None:
        if issuer.refreshable:
            raise UnknownKey(config.issuer)
        reject("unknown_key")
    bound = key.by_alg.get(routed.alg)
    if bound is None:
        reject("algorithm")
    try:
        claims = jwt.decode(
            token,
            bound,
            algorithms=config.algorithms,
            audience=config.audience,
            issuer=config.issuer,
            options={
                "require": _REQUIRED,
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "enforce_minimum_key_length": True,
            },
        )
    except MissingRequiredClaimError as exc:
        reject(f"missing_{exc.claim}" if exc.claim in _REQUIRED else "missing_claim")
    except InvalidSignatureError:
        reject("signature")
    except InvalidAlgorithmError:
        reject("algorithm")
    except InvalidAudienceError:
        reject("audience")
    except InvalidIssuerError:
        reject("issuer")
    except InvalidSubjectError:
        reject("bad_sub")
    except InvalidKeyError:
        reject("weak_key")
    except DecodeError:
        reject("malformed")
    except PyJWTError:
        reject("invalid")
    return principal_from_claims(claims, config, now)


def principal_from_claims(claims: Mapping[str, Any], config: IssuerConfig, now: float) -> Principal:
    """Time checks against ``now`` and the tenant, subject and scopes."""
    leeway = config.leeway_s
    exp = _number(claims, "exp")
    if exp is None:
        reject("missing_exp")
    nbf = _number(claims, "nbf")
    iat = _number(claims, "iat")
    if now >= exp + leeway:
        reject("expired")
    if nbf is not None and nbf > now + leeway:
        reject("not_yet_valid")
    if iat is not None and iat > now + leeway:
        reject("issued_in_future")
    lifetime = exp - (iat if iat is not None else now)
    if lifetime > config.max_lifetime_s:
        reject("lifetime")
    tenant = claims.get(config.tenant_claim)
    if not isinstance(tenant, str) or not tenant:
        reject("missing_tenant")
    subject = claims.get("sub")
    if subject is not None and not isinstance(subject, str):
        reject("bad_sub")
    return Principal(
        tenant=tenant,
        subject=subject or "-",
        scopes=_scopes(claims.get(config.scope_claim)),
        kind="jwt",
        expires_at=exp,
        issuer=config.issuer,
    )
