"""Authentication and authorization (spec §3, §4 "Scopes", §5, §12 "Credentials").

Theory of operation:

* :meth:`Authenticator.authenticate` takes *all* ``Authorization`` header
  values. Anything but exactly one ``Bearer <value>`` is
  ``missing_credentials``. A JWT-shaped value is verified as a JWT, anything
  else is matched as a static API key; a credential whose tenant has no
  policy is ``tenant_not_configured``.
* The Authenticator owns the current :class:`KeySet`. ``swap`` replaces it
  whole (SIGHUP) and empties the verified-token cache, so a removed key stops
  working at once. A token whose ``kid`` is unknown triggers one re-read
  (file) or re-fetch (URL) of its issuer's keys, at most once per
  ``jwks_refresh_min_s`` per issuer, serialized per issuer.
* Verified JWTs are cached by SHA-256 of the token in a bounded LRU, each
  entry only until the token's ``exp``; after that the token is verified
  afresh (and refused once past its leeway). A cache generation counter
  keeps a verification that raced a key change from being cached.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import jwt

from gateway.auth.apikeys import match_api_key
from gateway.auth.keys import (
    IssuerKeys,
    KeyFetchError,
    KeySet,
    carry_fetched,
    fetch_jwks_url,
    hs256_secret,
    jwks_client,
    read_jwks_file,
)
from gateway.auth.principal import Principal
from gateway.auth.tokens import JWT_SHAPE, UnknownKey, reject, route, verify
from gateway.config import AuthConfig, IssuerConfig
from gateway.config.policy import PolicySet, Tenant
from gateway.core.errors import GatewayError

if TYPE_CHECKING:
    import httpx

#: far above any real JWT; refuses absurd values before any parsing
MAX_BEARER_CHARS = 16_384


def bearer_value(authorization: list[str]) -> str:
    """The one bearer credential, or ``missing_credentials``."""
    if len(authorization) != 1:
        raise GatewayError("missing_credentials")
    parts = authorization[0].split(maxsplit=1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        raise GatewayError("missing_credentials")
    value = parts[1].strip()
    if not value:
        raise GatewayError("missing_credentials")
    return value


class Authenticator:
    def __init__(
        self,
        keys: KeySet,
        *,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        cache_size: int = 10_000,
    ) -> None:
        self._http = http
        self._clock = clock
        self._cache_size = cache_size
        self._cache: OrderedDict[bytes, Principal] = OrderedDict()
        self._generation = 0
        self._last_refresh: dict[str, float] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._owns_http = False
        self._keys = keys

    @property
    def keys(self) -> KeySet:
        return self._keys

    def swap(self, new: KeySet) -> None:
        """Replace the key set (SIGHUP); keys not in ``new`` stop working now."""
        self._keys = carry_fetched(self._keys, new)
        self._invalidate()

    async def prefetch(self) -> list[str]:
        """Fetch every jwks_url issuer that has no keys yet; return the problems.

        For the app's startup, so the first request does not pay for the
        fetch. Failures are returned, not raised: the issuer is retried on
        demand (rate-limited) later.
        """
        problems = []
        for name, issuer in self._keys.issuers.items():
            if issuer.config.jwks_url is not None and not issuer.keys:
                error = await self._refresh(issuer)
                if error is not None:
                    problems.append(f"issuer {name}: {error}")
        return problems

    async def authenticate(self, authorization: list[str], policies: PolicySet) -> Principal:
        value = bearer_value(authorization)
        if len(value) > MAX_BEARER_CHARS:
            reject("too_long")
        if JWT_SHAPE.fullmatch(value):
            principal = await self._verify_jwt(value)
        else:
            principal = match_api_key(value, policies)
        if principal.tenant not in policies.tenants:
            raise GatewayError("tenant_not_configured")
        return principal

    async def _verify_jwt(self, token: str) -> Principal:
        digest = hashlib.sha256(token.encode("ascii")).digest()
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None:
            if cached.expires_at is not None and now < cached.expires_at:
                self._cache.move_to_end(digest)
                return cached
            del self._cache[digest]
        generation = self._generation
        routed = route(token, self._keys)
        try:
            principal = verify(token, routed, now)
        except UnknownKey:
            await self._refresh(routed.issuer)
            routed = route(token, self._keys)
            try:
                principal = verify(token, routed, now)
            except UnknownKey:
                reject("unknown_key")
            generation = self._generation
        if generation == self._generation:
            self._remember(digest, principal)
        return principal

    def _remember(self, digest: bytes, principal: Principal) -> None:
        if self._cache_size <= 0:
            return
        self._cache[digest] = principal
        self._cache.move_to_end(digest)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _invalidate(self) -> None:
        self._generation += 1
        self._cache.clear()

    async def _refresh(self, seen: IssuerKeys) -> str | None:
        """Reload one issuer's keys unless done recently; return the problem, if any."""
        name = seen.config.issuer
        lock = self._locks.setdefault(name, anyio.Lock())
        async with lock:
            current = self._keys.get(name)
            if current is not seen:
                # Someone refreshed or swapped while we waited: use their result.
                return None
            now = self._clock()
            last = self._last_refresh.get(name)
            # A clock stepping backwards must not block refreshes for that long.
            if last is not None and 0 <= now - last < current.config.jwks_refresh_min_s:
                return None
            self._last_refresh[name] = now
            try:
                fresh = await self._load(current.config)
            except KeyFetchError as exc:
                return str(exc)
            if self._keys.get(name) is current:
                self._keys = self._keys.with_issuer(fresh)
                self._invalidate()
            return None

    async def _load(self, config: IssuerConfig) -> IssuerKeys:
        if config.jwks_file is not None:
            return await anyio.to_thread.run_sync(read_jwks_file, config)
        if config.jwks_url is not None:
            return await fetch_jwks_url(config, self._client())
        raise KeyFetchError("issuer has no refreshable key source")

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # Created on first need: most deployments have no jwks_url issuer.
            self._http = jwks_client()
            self._owns_http = True
        return self._http

    async def aclose(self) -> None:
        """Close the HTTP client if this Authenticator created it (not an injected one)."""
        if self._owns_http and self._http is not None:
            await self._http.aclose()
        self._http = None
        self._owns_http = False


def authorize(principal: Principal, tenant: Tenant, endpoint: str | None, scope: str) -> None:
    """Refuse unless the credential's issuer is allowed for the tenant, the
    tenant allows ``endpoint`` (None: a route of no tenant's, ``/metrics``) and
    the credential has ``scope``."""
    if principal.tenant != tenant.name:
        # A caller bug, not a caller's doing; refuse rather than serve across tenants.
        raise GatewayError("tenant_not_configured")
    issuers = tenant.policy.issuers
    if issuers is not None and principal.kind == "jwt" and principal.issuer not in issuers:
        raise GatewayError("issuer_not_allowed")
    if endpoint is not None and not tenant.allows_endpoint(endpoint):
        raise GatewayError("endpoint_not_allowed")
    if scope not in principal.scopes:
        raise GatewayError("insufficient_scope")


def mint_dev_token(
    auth: AuthConfig,
    tenant: str,
    *,
    scopes: list[str],
    ttl_s: int,
    issuer: str | None = None,
    env: Mapping[str, str],
    subject: str = "dev",
) -> str:
    """Sign a development JWT with a configured HS256 issuer (``token`` verb).

    Raises ValueError with an operator-facing message (never the secret).
    """
    candidates = [i for i in auth.issuers if i.hs256_secret_env is not None]
    if issuer is not None:
        candidates = [i for i in candidates if i.issuer == issuer]
    if not candidates:
        which = f" with issuer {issuer!r}" if issuer is not None else ""
        raise ValueError(f"no HS256 (hs256_secret_env) issuer{which} is configured")
    config = candidates[0]
    if ttl_s <= 0:
        raise ValueError("ttl must be positive")
    if ttl_s > config.max_lifetime_s:
        raise ValueError(f"ttl {ttl_s}s exceeds max_lifetime_s of issuer {config.issuer}")
    try:
        secret = hs256_secret(config, env)
    except KeyFetchError as exc:
        raise ValueError(str(exc)) from None
    now = int(time.time())
    claims = {
        "iss": config.issuer,
        "aud": config.audience,
        "iat": now,
        "exp": now + ttl_s,
        "sub": subject,
        config.tenant_claim: tenant,
        config.scope_claim: " ".join(scopes),
    }
    return jwt.encode(claims, secret, algorithm="HS256")
