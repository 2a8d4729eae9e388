"""A real stack on loopback for integration tests: simulator + gateway (uvicorn).

Tenants: ``acme`` (RS256 tokens from the fixture JWKS, HS256 dev tokens, and a
static API key) and ``globex`` (a second tenant for isolation tests).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.auth.authenticator import mint_dev_token
from gateway.observe.tracing import Tracing
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    Gateway,
    default_policy,
    read_receipts,
    wait_receipt,
    write_config,
)
from gateway.testing.simulator import SimRequest, Simulator
from tests.support.jwt import (
    AUDIENCE,
    HS_SECRET,
    ISSUER,
    JWKS_PATH,
    make_claims,
    sign_hs256,
    sign_rs256,
)

API_KEY = "sk-test-acme-nightly-batch-0000000000000000"
API_KEY_SHA = hashlib.sha256(API_KEY.encode()).hexdigest()
DEV_ISSUER = "https://dev.gateway.local"


def issuers() -> list[dict[str, Any]]:
    return [
        {
            "issuer": ISSUER,
            "audience": AUDIENCE,
            "algorithms": ["RS256"],
            "jwks_file": str(JWKS_PATH),
            "max_lifetime_s": 3600,
        },
        {
            "issuer": DEV_ISSUER,
            "audience": "mistralrs-gateway",
            "algorithms": ["HS256"],
            "hs256_secret_env": DEMO_SECRET_ENV,
        },
    ]


def metrics_headers(tenant: str = "acme") -> dict[str, str]:
    """A scraper's credential for ``/metrics`` on the callers' port (spec §24): a
    token with scope ``metrics`` only, from the development HS256 issuer (its
    secret is the test session's), so that it outlives a test's RS256 key rotation."""
    claims = make_claims(
        iss=DEV_ISSUER, aud="mistralrs-gateway", tenant=tenant, scope="metrics", sub="scraper"
    )
    return {"authorization": f"Bearer {sign_hs256(claims)}"}


def policies(globex: dict[str, Any] | None = None, **acme: Any) -> dict[str, dict[str, Any]]:
    acme_policy = default_policy("acme", api_keys=[{"name": "nightly", "sha256": API_KEY_SHA}])
    acme_policy.update(acme)
    return {"acme": acme_policy, "globex": default_policy("globex", **(globex or {}))}


class Stack:
    def __init__(self, directory: Path, sim: Simulator, gateway: Gateway) -> None:
        self.dir = directory
        self.sim = sim
        self.gw = gateway
        self.sdk_clients: list[openai.OpenAI] = []

    def sdk(self, token: str | None = None, *, timeout: float = 10) -> openai.OpenAI:
        """An openai SDK client on the gateway, closed with the stack."""
        client = openai.OpenAI(
            base_url=self.url + "/v1",
            api_key=token or self.rs256(),
            max_retries=0,
            timeout=timeout,
        )
        self.sdk_clients.append(client)
        return client

    def close_clients(self) -> None:
        for client in self.sdk_clients:
            client.close()
        self.sdk_clients.clear()

    @property
    def url(self) -> str:
        return self.gw.base_url

    @property
    def runtime(self) -> Any:
        return self.gw.runtime

    def rs256(self, tenant: str = "acme", **claims: Any) -> str:
        return sign_rs256(make_claims(tenant=tenant, **claims))

    def dev_token(
        self, tenant: str = "acme", scopes: tuple[str, ...] = ("inference", "evidence")
    ) -> str:
        return mint_dev_token(
            self.runtime.config.auth,
            tenant,
            scopes=list(scopes),
            ttl_s=600,
            issuer=DEV_ISSUER,
            env={DEMO_SECRET_ENV: HS_SECRET},
        )

    def headers(self, token: str | None = None, **extra: str) -> dict[str, str]:
        out = {"authorization": f"Bearer {token or self.rs256()}"}
        out.update(extra)
        return out

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(token), **kwargs)

    def receipts(self) -> list[dict[str, Any]]:
        return read_receipts(self.runtime.config.audit.path)

    def receipt(self, request_id: str, timeout_s: float = 5) -> dict[str, Any]:
        return wait_receipt(self.runtime.config.audit.path, request_id, timeout_s)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels``
        (``gateway_permits_in_use``: every upstream's, unless one is named)."""
        total = 0.0
        for family in self.runtime.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += float(sample.value)
        return total


def worker_posts(sim: Simulator) -> list[SimRequest]:
    """Every POST the worker received: inference and any admin route (the
    readiness poll only GETs). Tests assert on it to show what got through."""
    return [r for r in sim.requests() if r.method == "POST"]


def chat_body(text: str = "hello", *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gemma-4-mm",
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    }
    body.update(extra)
    return body


def sse_data(text: str) -> list[str]:
    """The data payloads of an SSE body, in order (comments skipped)."""
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


@contextmanager
def running_stack(
    directory: Path,
    *,
    acme: dict[str, Any] | None = None,
    globex: dict[str, Any] | None = None,
    sim_options: dict[str, Any] | None = None,
    server_options: dict[str, Any] | None = None,
    more_upstreams: list[dict[str, Any]] | None = None,
    tracing: Tracing | None = None,
    kinds: dict[str, str] | None = None,
    **sections: Any,
) -> Iterator[Stack]:
    """The simulator behind a gateway. ``more_upstreams`` adds workers (spec §16):
    the simulator is then the upstream named ``default`` among them. ``kinds``
    adds routes of other kinds (spec §23: route -> kind) beside its chat route,
    served by the same simulator."""
    from gateway.testing.harness import SIM_ROUTE

    extra = list((kinds or {}).items())
    sim = Simulator(model_ids=[SIM_ROUTE, *extra], **(sim_options or {}))
    sim.start()
    try:
        if more_upstreams or extra:
            routes = [SIM_ROUTE, *({"route": r, "kind": k} for r, k in extra)]
            default = {"name": "default", "base_url": sim.base_url, "routes": routes}
            default.update(sections.pop("upstream", {}))
            sections["upstreams"] = [default, *(more_upstreams or [])]
        config = write_config(
            directory,
            upstream_port=sim.port,
            policies=policies(globex, **(acme or {})),
            issuers=issuers(),
            **sections,
        )
        with Gateway(config, tracing=tracing, **(server_options or {})) as gateway:
            stack = Stack(directory, sim, gateway)
            assert gateway.wait_ready(), "gateway never saw the simulator ready"
            try:
                yield stack
            finally:
                stack.close_clients()
    finally:
        sim.stop()
