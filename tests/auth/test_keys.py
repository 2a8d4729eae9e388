"""Key material: loading, JWKS fetching, refresh on unknown kid, rotation, swap."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gateway.auth.authenticator import Authenticator
from gateway.auth.keys import KeyFetchError, fetch_jwks_url, load_key_set, parse_jwks
from gateway.config.loader import ConfigError
from gateway.config.policy import PolicySet
from gateway.core.errors import GatewayError
from tests.auth.conftest import (
    ENV,
    HS_ENV,
    FakeClock,
    auth_config,
    hs_issuer,
    reason,
    rs_issuer,
    url_issuer,
)
from tests.support.jwt import (
    HS_SECRET,
    JWKS_EC_PATH,
    JWKS_PATH,
    JWKS_ROTATED_PATH,
    make_claims,
    sign_rs256,
)

JWKS = JWKS_PATH.read_bytes()
ROTATED = JWKS_ROTATED_PATH.read_bytes()
URL = "https://idp.test/jwks.json"


def _jwks_with(**changes: Any) -> bytes:
    doc = json.loads(JWKS)
    doc["keys"][0].update(changes)
    return json.dumps(doc).encode()


# -- load_key_set -------------------------------------------------------------


def test_load_file_and_env() -> None:
    keys = load_key_set(auth_config(rs_issuer(), hs_issuer()), ENV)
    rs = keys.get("https://idp.test")
    assert rs is not None
    assert [k.kid for k in rs.keys] == ["k1"]
    assert set(rs.keys[0].by_alg) == {"RS256"}
    hs = keys.get("https://dev.test")
    assert hs is not None
    assert set(hs.keys[0].by_alg) == {"HS256"}
    assert HS_SECRET not in repr(keys)


def test_every_problem_is_listed_without_secret_material(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    short = "short-secret-value"
    auth = auth_config(
        rs_issuer(tmp_path / "missing.json"),
        rs_issuer(bad_json, issuer="https://two.test"),
        hs_issuer(),
        hs_issuer(issuer="https://four.test", hs256_secret_env="GW_SHORT"),
        hs_issuer(issuer="https://five.test", hs256_secret_env="GW_EMPTY"),
        url_issuer("http://idp.example/jwks.json", issuer="https://six.test"),
    )
    with pytest.raises(ConfigError) as info:
        load_key_set(auth, {"GW_SHORT": short, "GW_EMPTY": ""})
    errors = info.value.errors
    assert len(errors) == 6
    assert errors[0].startswith("auth.issuers[0] (https://idp.test): jwks_file ")
    assert "cannot read" in errors[0]
    assert "not valid JSON" in errors[1]
    assert f"{HS_ENV} is not set or empty" in errors[2]
    assert "GW_SHORT is shorter than 32 bytes" in errors[3]
    assert "GW_EMPTY is not set or empty" in errors[4]
    assert "https://" in errors[5]
    assert all(short not in e for e in errors)


def test_loopback_http_jwks_url_is_allowed() -> None:
    auth = auth_config(url_issuer("http://127.0.0.1:9000/jwks"))
    issuer = load_key_set(auth, {}).get("https://idp.test")
    assert issuer is not None
    assert issuer.keys == ()


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(JWKS)
    with pytest.raises(ConfigError, match="larger than jwks_max_bytes"):
        load_key_set(auth_config(rs_issuer(path, jwks_max_bytes=len(JWKS) - 1)), {})


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"[]", "not a JWK Set"),
        (b'{"keys": {}}', "not a JWK Set"),
        (b'{"keys": []}', "no key usable"),
        (b'{"keys": [1]}', r"keys\[0\] is not an object"),
        (_jwks_with(d="AQAB"), "key 'k1': contains private or symmetric key material"),
        (_jwks_with(kid=5), "kid must be a string"),
        (_jwks_with(n="!!"), "key 'k1': malformed RSA key"),
        (_jwks_with(alg="RS512"), "no key usable"),
        (_jwks_with(use="enc"), "no key usable"),
        (JWKS_EC_PATH.read_bytes(), "no key usable"),
    ],
)
def test_bad_jwks_documents(document: bytes, message: str) -> None:
    with pytest.raises(KeyFetchError, match=message):
        parse_jwks(document, rs_issuer())


def test_duplicate_kid_is_refused() -> None:
    doc = json.loads(JWKS)
    doc["keys"].append(doc["keys"][0])
    with pytest.raises(KeyFetchError, match="duplicate kid"):
        parse_jwks(json.dumps(doc).encode(), rs_issuer())


def test_jwk_without_alg_gets_every_allowed_rsa_alg() -> None:
    doc = json.loads(JWKS)
    del doc["keys"][0]["alg"]
    keys = parse_jwks(json.dumps(doc).encode(), rs_issuer(algorithms=["RS256", "PS256", "ES256"]))
    assert set(keys[0].by_alg) == {"RS256", "PS256"}


def test_unusable_keys_are_skipped_next_to_usable_ones() -> None:
    doc = json.loads(JWKS)
    doc["keys"] += json.loads(JWKS_EC_PATH.read_bytes())["keys"]
    assert [k.kid for k in parse_jwks(json.dumps(doc).encode(), rs_issuer())] == ["k1"]


# -- jwks_url -----------------------------------------------------------------


class Idp:
    """A MockTransport handler serving a JWKS and counting requests."""

    def __init__(self, body: bytes = JWKS) -> None:
        self.body = body
        self.requests: list[httpx.Request] = []
        self.status = 200
        self.headers: dict[str, str] = {}
        self.stream: AsyncIterator[bytes] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/elsewhere":
            raise AssertionError("redirect was followed")
        if self.stream is not None:
            return httpx.Response(self.status, headers=self.headers, content=self.stream)
        return httpx.Response(self.status, headers=self.headers, content=self.body)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))


@contextlib.asynccontextmanager
async def _url_auth(idp: Idp, clock: FakeClock, *issuers: Any) -> AsyncIterator[Authenticator]:
    """An Authenticator whose jwks_url issuers are served by ``idp``."""
    config = auth_config(*issuers)
    async with idp.client() as http:
        yield Authenticator(load_key_set(config, {}), http=http, clock=clock)


async def test_fetch_ok() -> None:
    idp = Idp()
    async with idp.client() as http:
        keys = await fetch_jwks_url(url_issuer(URL), http)
    assert [k.kid for k in keys.keys] == ["k1"]
    assert idp.requests[0].headers["accept"] == "application/json"


async def test_fetch_refuses_declared_oversize() -> None:
    idp = Idp()
    async with idp.client() as http:
        with pytest.raises(KeyFetchError, match="larger than jwks_max_bytes"):
            await fetch_jwks_url(url_issuer(URL, jwks_max_bytes=len(JWKS) - 1), http)


async def test_fetch_bounds_a_streamed_body_without_length() -> None:
    idp = Idp()
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        while True:
            sent.append(1)
            yield b" " * 1024

    idp.stream = endless()
    async with idp.client() as http:
        with pytest.raises(KeyFetchError, match="larger than jwks_max_bytes"):
            await fetch_jwks_url(url_issuer(URL, jwks_max_bytes=10_000), http)
    assert len(sent) <= 11


async def test_fetch_does_not_follow_redirects() -> None:
    idp = Idp()
    idp.status = 302
    idp.headers = {"location": "https://idp.test/elsewhere"}
    async with idp.client() as http:
        with pytest.raises(KeyFetchError, match="HTTP status 302"):
            await fetch_jwks_url(url_issuer(URL), http)
    assert len(idp.requests) == 1


async def test_fetch_maps_transport_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        with pytest.raises(KeyFetchError, match=r"request failed \(ConnectError\)"):
            await fetch_jwks_url(url_issuer(URL), http)


async def test_own_client_when_none_injected(
    clock: FakeClock, policies: PolicySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    idp = Idp()
    made: list[httpx.AsyncClient] = []
    real = httpx.AsyncClient

    def factory(**kwargs: Any) -> httpx.AsyncClient:
        # No redirects and no proxy from the environment for a key fetch.
        assert kwargs["follow_redirects"] is False and kwargs["trust_env"] is False
        made.append(real(transport=httpx.MockTransport(idp), **kwargs))
        return made[-1]

    config = auth_config(url_issuer(URL))
    auth = Authenticator(load_key_set(config, {}), clock=clock)
    monkeypatch.setattr(httpx, "AsyncClient", factory)
    await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now)))
    assert len(made) == 1
    await auth.aclose()
    assert made[0].is_closed


async def test_injected_client_is_not_closed(clock: FakeClock) -> None:
    async with Idp().client() as http:
        config = auth_config(url_issuer(URL))
        auth = Authenticator(load_key_set(config, {}), http=http, clock=clock)
        await auth.aclose()
        assert not http.is_closed


async def _auth_ok(auth: Authenticator, policies: PolicySet, token: str) -> None:
    assert (await auth.authenticate([f"Bearer {token}"], policies)).tenant == "acme"


async def _auth_fails(auth: Authenticator, policies: PolicySet, token: str) -> str:
    with pytest.raises(GatewayError) as info:
        await auth.authenticate([f"Bearer {token}"], policies)
    assert info.value.code == "invalid_token"
    return reason(info.value)


async def test_url_keys_fetched_on_first_use_and_refresh_rate_limited(
    clock: FakeClock, policies: PolicySet
) -> None:
    idp = Idp()
    async with _url_auth(idp, clock, url_issuer(URL)) as auth:
        await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now)))
        assert len(idp.requests) == 1

        rotated = sign_rs256(make_claims(now=clock.now), kid="k2", key="rsa2")
        assert await _auth_fails(auth, policies, rotated) == "unknown_key"
        assert len(idp.requests) == 1  # the first fetch was under 2 s ago
        clock.advance(2)
        assert await _auth_fails(auth, policies, rotated) == "unknown_key"
        assert len(idp.requests) == 2
        clock.advance(1.9)
        idp.body = ROTATED
        assert await _auth_fails(auth, policies, rotated) == "unknown_key"
        assert len(idp.requests) == 2
        clock.advance(0.1)
        await _auth_ok(auth, policies, rotated)
        assert len(idp.requests) == 3
        # k1 left the IdP's set with that fetch.
        clock.advance(0.5)
        assert await _auth_fails(auth, policies, sign_rs256(make_claims(now=clock.now))) == (
            "unknown_key"
        )
        assert len(idp.requests) == 3


async def test_refresh_limit_is_per_issuer(clock: FakeClock, policies: PolicySet) -> None:
    idp = Idp()
    async with _url_auth(
        idp, clock, url_issuer(URL), url_issuer(URL, issuer="https://other.test")
    ) as auth:
        await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now)))
        other = make_claims(now=clock.now, iss="https://other.test")
        await _auth_ok(auth, policies, sign_rs256(other))
        assert len(idp.requests) == 2


async def test_failed_fetch_keeps_old_keys_and_counts_as_attempt(
    clock: FakeClock, policies: PolicySet
) -> None:
    idp = Idp()
    async with _url_auth(idp, clock, url_issuer(URL)) as auth:
        assert await auth.prefetch() == []
        idp.status = 500
        clock.advance(5)
        rotated = sign_rs256(make_claims(now=clock.now), kid="k2", key="rsa2")
        assert await _auth_fails(auth, policies, rotated) == "unknown_key"
        await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now)))
        assert await _auth_fails(auth, policies, rotated) == "unknown_key"
        assert len(idp.requests) == 2


async def test_prefetch_reports_problems(clock: FakeClock) -> None:
    idp = Idp(b"nope")
    async with _url_auth(idp, clock, url_issuer(URL)) as auth:
        assert await auth.prefetch() == ["issuer https://idp.test: not valid JSON"]


async def test_swap_keeps_fetched_url_keys(clock: FakeClock, policies: PolicySet) -> None:
    idp = Idp()
    async with _url_auth(idp, clock, url_issuer(URL)) as auth:
        await auth.prefetch()
        auth.swap(load_key_set(auth_config(url_issuer(URL)), {}))
        clock.advance(0.1)
        await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now)))
        assert len(idp.requests) == 1


# -- jwks_file rotation and swap ------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.write_text(text)


@pytest.fixture
def jwks_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwks.json"
    shutil.copyfile(JWKS_PATH, path)
    return path


async def test_rotated_file_is_picked_up_on_unknown_kid(
    jwks_file: Path, clock: FakeClock, policies: PolicySet
) -> None:
    config = auth_config(rs_issuer(jwks_file))
    auth = Authenticator(load_key_set(config, {}), clock=clock)
    old = sign_rs256(make_claims(now=clock.now))
    await _auth_ok(auth, policies, old)
    shutil.copyfile(JWKS_ROTATED_PATH, jwks_file)
    await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now), kid="k2", key="rsa2"))
    # The re-read replaced the set: k1 is gone, even for a token seen before.
    clock.advance(3)
    assert await _auth_fails(auth, policies, old) == "unknown_key"


async def test_broken_file_on_refresh_keeps_current_keys(
    jwks_file: Path, clock: FakeClock, policies: PolicySet
) -> None:
    config = auth_config(rs_issuer(jwks_file))
    auth = Authenticator(load_key_set(config, {}), clock=clock)
    _write(jwks_file, "{broken")
    rotated = sign_rs256(make_claims(now=clock.now), kid="k2", key="rsa2")
    assert await _auth_fails(auth, policies, rotated) == "unknown_key"
    await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now)))


async def test_swap_drops_removed_keys(
    jwks_file: Path, clock: FakeClock, policies: PolicySet
) -> None:
    config = auth_config(rs_issuer(jwks_file))
    auth = Authenticator(load_key_set(config, {}), clock=clock)
    old = sign_rs256(make_claims(now=clock.now))
    await _auth_ok(auth, policies, old)  # now cached
    shutil.copyfile(JWKS_ROTATED_PATH, jwks_file)
    auth.swap(load_key_set(config, {}))
    assert await _auth_fails(auth, policies, old) == "unknown_key"
    await _auth_ok(auth, policies, sign_rs256(make_claims(now=clock.now), kid="k2", key="rsa2"))


async def test_swap_to_a_set_without_the_issuer(clock: FakeClock, policies: PolicySet) -> None:
    config = auth_config(rs_issuer())
    auth = Authenticator(load_key_set(config, {}), clock=clock)
    token = sign_rs256(make_claims(now=clock.now))
    await _auth_ok(auth, policies, token)
    auth.swap(load_key_set(auth_config(), {}))
    assert await _auth_fails(auth, policies, token) == "unknown_issuer"


async def test_concurrent_unknown_kids_share_one_fetch(
    clock: FakeClock, policies: PolicySet
) -> None:
    requests: list[httpx.Request] = []

    async def slow_idp(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        await anyio.sleep(0.01)
        return httpx.Response(200, content=ROTATED)

    config = auth_config(url_issuer(URL))
    token = sign_rs256(make_claims(now=clock.now), kid="k2", key="rsa2")
    async with httpx.AsyncClient(transport=httpx.MockTransport(slow_idp)) as http:
        auth = Authenticator(load_key_set(config, {}), http=http, clock=clock)
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(_auth_ok, auth, policies, token)
    assert len(requests) == 1
