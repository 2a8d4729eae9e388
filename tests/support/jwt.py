"""Sign test JWTs with the fixture keys in ``fixtures/keys`` (test-only keys).

``sign_raw`` builds tokens pyjwt refuses to make (``alg: none``, HS256 keyed
with a PEM), for the negative tests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from functools import cache
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

KEYS_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "keys"
JWKS_PATH = KEYS_DIR / "jwks.json"
JWKS_ROTATED_PATH = KEYS_DIR / "jwks_rotated.json"
JWKS_EC_PATH = KEYS_DIR / "jwks_ec.json"
RSA1_PUBLIC_PEM = KEYS_DIR / "rsa1_public.pem"

ISSUER = "https://idp.test"
AUDIENCE = "mistralrs-gateway"
TENANT = "acme"
#: 32+ bytes, as the gateway requires of an HS256 secret
HS_SECRET = "test-only-hs256-secret-0123456789abcdef"


def private_pem(name: str) -> bytes:
    """``rsa1``, ``rsa2`` or ``ec1`` from the fixtures, as PEM."""
    return (KEYS_DIR / f"{name}_private.pem").read_bytes()


@cache
def private_key(name: str) -> RSAPrivateKey | EllipticCurvePrivateKey:
    """The parsed key, cached: loading an RSA key checks it and is slow."""
    key = load_pem_private_key(private_pem(name), password=None)
    assert isinstance(key, RSAPrivateKey | EllipticCurvePrivateKey)
    return key


def make_claims(
    *,
    iss: str | None = ISSUER,
    aud: str | list[str] | None = AUDIENCE,
    tenant: str | None = TENANT,
    scope: str | list[str] | None = "inference evidence",
    sub: str | None = "user-1",
    now: float | None = None,
    ttl: int = 300,
    tenant_claim: str = "tenant",
    scope_claim: str = "scope",
    **extra: Any,
) -> dict[str, Any]:
    """Valid claims for the default test issuer; pass ``None`` to omit one.

    ``extra`` overrides or adds claims; an ``extra`` value of None removes
    that claim (e.g. ``exp=None``).
    """
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "iss": iss,
        "aud": aud,
        "iat": issued,
        "exp": issued + ttl,
        "sub": sub,
        tenant_claim: tenant,
        scope_claim: scope,
    }
    claims.update(extra)
    return {k: v for k, v in claims.items() if v is not None}


def sign_rs256(claims: dict[str, Any], kid: str | None = "k1", key: str = "rsa1") -> str:
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(claims, private_key(key), algorithm="RS256", headers=headers)


def sign_es256(claims: dict[str, Any], kid: str | None = "e1") -> str:
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(claims, private_key("ec1"), algorithm="ES256", headers=headers)


def sign_hs256(claims: dict[str, Any], secret: str = HS_SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_raw(header: dict[str, Any], claims: dict[str, Any], hmac_key: bytes | None) -> str:
    """A compact JWS with any header: HMAC-SHA256 with ``hmac_key``, or no signature."""
    signing_input = (
        _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    ).encode("ascii")
    signature = (
        b"" if hmac_key is None else hmac.new(hmac_key, signing_input, hashlib.sha256).digest()
    )
    return signing_input.decode("ascii") + "." + _b64(signature)
