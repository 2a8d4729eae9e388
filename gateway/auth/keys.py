"""Key material per issuer: JWKS files, JWKS URLs and HS256 secrets.

Theory of operation:

* :func:`load_key_set` builds an immutable :class:`KeySet` from the auth
  config at start and on SIGHUP. Files and env secrets are read there and
  every problem is collected into one ``ConfigError``. ``jwks_url`` issuers
  start empty: their keys are fetched on first use (or by a prefetch), since
  loading is synchronous and holds no HTTP client.
* Each JWK is turned into one ``PyJWK`` per algorithm that is in the issuer's
  allowlist *and* fits the key's type (and its own ``alg``, when it names
  one). Verification then looks up ``(kid, header alg)``; a key can never
  verify an algorithm of another family, which closes the RS/HS confusion.
* Refreshing (re-read or re-fetch) produces a new :class:`IssuerKeys`; the
  caller swaps it into a new KeySet. Nothing here is mutated after building.
* Error texts name the issuer, the key id, the file or the env var, never key
  or secret material.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
from jwt import PyJWK, PyJWTError

from gateway.config import AuthConfig, IssuerConfig, is_loopback_host
from gateway.config.loader import ConfigError

if TYPE_CHECKING:
    import httpx  # imported only where an issuer has jwks_url (~5 MB of RSS)

#: whole-fetch bound for one JWKS download (connect + headers + body)
JWKS_FETCH_TIMEOUT_S = 5.0
#: RFC 7518 §3.2: an HS256 key must be at least as long as the hash output
MIN_HS256_SECRET_BYTES = 32

_EC_CURVE_ALGS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "P-256": frozenset({"ES256"}),
        "P-384": frozenset({"ES384"}),
        "P-521": frozenset({"ES512"}),
    }
)
_RSA_ALGS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
# Members that only a private (or symmetric) JWK has; a public set carrying
# them means someone published a signing key.
_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})


class KeyFetchError(Exception):
    """A JWKS could not be read, fetched or parsed; the text is operator-safe."""


@dataclass(frozen=True, slots=True)
class VerificationKey:
    kid: str | None
    #: header ``alg`` -> key bound to exactly that algorithm
    by_alg: Mapping[str, PyJWK] = field(repr=False)


@dataclass(frozen=True, slots=True)
class IssuerKeys:
    config: IssuerConfig
    keys: tuple[VerificationKey, ...]

    @property
    def refreshable(self) -> bool:
        return self.config.hs256_secret_env is None

    def find(self, kid: str | None) -> VerificationKey | None:
        """The key a token's ``kid`` names; None when it is unknown here."""
        if not self.refreshable:
            # A shared secret is one key; a kid in such a token identifies nothing.
            return self.keys[0] if self.keys else None
        if kid is None:
            return self.keys[0] if len(self.keys) == 1 else None
        for key in self.keys:
            if key.kid == kid:
                return key
        return None


@dataclass(frozen=True, slots=True)
class KeySet:
    """Immutable: issuer value -> its keys. Reloads build a new one."""

    issuers: Mapping[str, IssuerKeys]

    def get(self, issuer: str) -> IssuerKeys | None:
        return self.issuers.get(issuer)

    def with_issuer(self, keys: IssuerKeys) -> KeySet:
        issuers = dict(self.issuers)
        issuers[keys.config.issuer] = keys
        return KeySet(MappingProxyType(issuers))


def _label(index: int, issuer: IssuerConfig) -> str:
    return f"auth.issuers[{index}] ({issuer.issuer})"


def _compatible_algs(jwk: Mapping[str, Any]) -> frozenset[str]:
    kty = jwk.get("kty")
    if kty == "RSA":
        return _RSA_ALGS
    if kty == "EC":
        return _EC_CURVE_ALGS.get(str(jwk.get("crv")), frozenset())
    if kty == "OKP" and jwk.get("crv") in ("Ed25519", "Ed448"):
        return frozenset({"EdDSA"})
    return frozenset()


def parse_jwks(data: bytes, issuer: IssuerConfig) -> tuple[VerificationKey, ...]:
    """Parse a JWKS document into keys usable under the issuer's allowlist.

    Keys of a type or algorithm the issuer does not allow are skipped (an
    IdP's set often serves several); a malformed key of a usable type, a
    private member, a duplicate kid, or no usable key at all is an error.
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise KeyFetchError("not valid JSON") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise KeyFetchError('not a JWK Set (an object with a "keys" list)')
    problems: list[str] = []
    keys: list[VerificationKey] = []
    seen: set[str | None] = set()
    allowed = frozenset(issuer.algorithms)
    for index, jwk in enumerate(doc["keys"]):
        if not isinstance(jwk, dict):
            problems.append(f"keys[{index}] is not an object")
            continue
        kid = jwk.get("kid")
        name = f"key {kid!r}" if isinstance(kid, str) else f"keys[{index}]"
        if kid is not None and not isinstance(kid, str):
            problems.append(f"{name}: kid must be a string")
            continue
        if _PRIVATE_MEMBERS & jwk.keys():
            problems.append(f"{name}: contains private or symmetric key material")
            continue
        if jwk.get("use", "sig") != "sig":
            continue
        algs = _compatible_algs(jwk) & allowed
        if "alg" in jwk:
            algs &= {jwk["alg"]}
        if not algs:
            continue
        if kid in seen:
            problems.append(f"{name}: duplicate kid")
            continue
        seen.add(kid)
        try:
            by_alg = {alg: PyJWK.from_dict(jwk, algorithm=alg) for alg in sorted(algs)}
        except PyJWTError:
            problems.append(f"{name}: malformed {jwk.get('kty')} key")
            continue
        keys.append(VerificationKey(kid, MappingProxyType(by_alg)))
    if problems:
        raise KeyFetchError("; ".join(problems))
    if not keys:
        raise KeyFetchError(f"no key usable with algorithms {issuer.algorithms}")
    if len(keys) > 1 and None in seen:
        raise KeyFetchError("a key without kid in a set of several keys")
    return tuple(keys)


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise KeyFetchError(f"cannot read ({type(exc).__name__})") from exc
    if len(data) > max_bytes:
        raise KeyFetchError("larger than jwks_max_bytes")
    return data


def read_jwks_file(issuer: IssuerConfig) -> IssuerKeys:
    assert issuer.jwks_file is not None
    try:
        keys = parse_jwks(_read_bounded(issuer.jwks_file, issuer.jwks_max_bytes), issuer)
    except KeyFetchError as exc:
        raise KeyFetchError(f"jwks_file {issuer.jwks_file}: {exc}") from exc
    return IssuerKeys(issuer, keys)


def jwks_client() -> httpx.AsyncClient:
    """The HTTP client of ``jwks_url`` issuers: no redirects, no proxy from the
    environment. httpx is imported here, on first need: most deployments read
    their keys from files or a secret, and a serving gateway has no other use
    for it."""
    import httpx

    return httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=JWKS_FETCH_TIMEOUT_S)


async def fetch_jwks_url(issuer: IssuerConfig, http: httpx.AsyncClient) -> IssuerKeys:
    """GET the issuer's JWKS: no redirects, bounded in time and size."""
    import httpx

    assert issuer.jwks_url is not None
    max_bytes = issuer.jwks_max_bytes
    body = bytearray()
    try:
        with anyio.fail_after(JWKS_FETCH_TIMEOUT_S):
            async with http.stream(
                "GET",
                issuer.jwks_url,
                headers={"accept": "application/json"},
                follow_redirects=False,
                timeout=JWKS_FETCH_TIMEOUT_S,
            ) as response:
                if response.status_code != 200:
                    raise KeyFetchError(f"HTTP status {response.status_code}")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise KeyFetchError("response larger than jwks_max_bytes")
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise KeyFetchError("response larger than jwks_max_bytes")
    except TimeoutError as exc:
        raise KeyFetchError("timed out") from exc
    except httpx.HTTPError as exc:
        raise KeyFetchError(f"request failed ({type(exc).__name__})") from exc
    return IssuerKeys(issuer, parse_jwks(bytes(body), issuer))


def hs256_secret(issuer: IssuerConfig, env: Mapping[str, str]) -> bytes:
    """The issuer's HS256 secret from the environment, or KeyFetchError."""
    name = issuer.hs256_secret_env
    assert name is not None
    value = env.get(name, "")
    if not value:
        raise KeyFetchError(f"hs256_secret_env {name} is not set or empty")
    secret = value.encode("utf-8")
    if len(secret) < MIN_HS256_SECRET_BYTES:
        raise KeyFetchError(
            f"hs256_secret_env {name} is shorter than {MIN_HS256_SECRET_BYTES} bytes"
        )
    return secret


def _secret_keys(issuer: IssuerConfig, env: Mapping[str, str]) -> IssuerKeys:
    secret = hs256_secret(issuer, env)
    jwk = {"kty": "oct", "k": base64.urlsafe_b64encode(secret).rstrip(b"=").decode("ascii")}
    key = VerificationKey(None, MappingProxyType({"HS256": PyJWK.from_dict(jwk, "HS256")}))
    return IssuerKeys(issuer, (key,))


def check_jwks_url(issuer: IssuerConfig) -> None:
    assert issuer.jwks_url is not None
    parts = urlsplit(issuer.jwks_url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and is_loopback_host(parts.hostname or ""):
        return
    # Keys fetched in clear text from elsewhere could be swapped in transit.
    raise KeyFetchError("jwks_url must be https:// (http:// only for a loopback host)")


def load_key_set(auth: AuthConfig, env: Mapping[str, str]) -> KeySet:
    """Build the KeySet for every configured issuer; ConfigError lists all problems."""
    errors: list[str] = []
    issuers: dict[str, IssuerKeys] = {}
    for index, issuer in enumerate(auth.issuers):
        try:
            if issuer.jwks_file is not None:
                issuers[issuer.issuer] = read_jwks_file(issuer)
            elif issuer.jwks_url is not None:
                check_jwks_url(issuer)
                issuers[issuer.issuer] = IssuerKeys(issuer, ())
            else:
                issuers[issuer.issuer] = _secret_keys(issuer, env)
        except KeyFetchError as exc:
            errors.append(f"{_label(index, issuer)}: {exc}")
    if errors:
        raise ConfigError(errors)
    return KeySet(MappingProxyType(issuers))


def carry_fetched(old: KeySet, new: KeySet) -> KeySet:
    """Keep already-fetched URL keys across a reload when the URL is unchanged.

    A reload re-reads files, not URLs; without this every jwks_url issuer
    would start empty again and hit its IdP on the next request.
    """
    result = new
    for name, fresh in new.issuers.items():
        before = old.get(name)
        if (
            fresh.config.jwks_url is not None
            and not fresh.keys
            and before is not None
            and before.config.jwks_url == fresh.config.jwks_url
            and before.config.algorithms == fresh.config.algorithms
        ):
            result = result.with_issuer(replace(before, config=fresh.config))
    return result
