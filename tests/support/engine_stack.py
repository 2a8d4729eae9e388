"""The real gateway in front of the engine adapter (the engine lane through the gateway).

``running_engine_stack(directory, adapter)`` is ``running_stack`` with the
adapter around the real mistral.rs engine as the upstream instead of the
simulator: the gateway's ``upstream.route`` and the tenants' model route are
the adapter's model folder, the alias callers use is :data:`ALIAS`. Several
gateways (different configs) may stand in front of one adapter. The model
has random weights: its text means nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.testing.harness import Gateway, default_policy, write_config
from tests.support.engine import EngineAdapter, Stream, parse_sse
from tests.support.stack import API_KEY_SHA, Stack, issuers

ALIAS = "random-llama"


def engine_policies(route: str, **extra: Any) -> dict[str, dict[str, Any]]:
    """Tenants ``acme`` (RS256, dev tokens, the static API key) and ``globex``
    may use :data:`ALIAS`: two tenants sharing the one worker (spec §21).
    ``extra`` goes into both policies (e.g. ``agents``)."""
    acme = default_policy(
        "acme",
        models={ALIAS: route},
        api_keys=[{"name": "nightly", "sha256": API_KEY_SHA}],
        modalities=["text"],
        # The lane compares the worker's own answer byte for byte: every usage field.
        usage_details="full",
        **extra,
    )
    globex = default_policy("globex", models={ALIAS: route}, modalities=["text"], **extra)
    return {"acme": acme, "globex": globex}


class EngineStack(Stack):
    """A :class:`Stack` whose worker is the engine adapter (``sim`` is unused)."""

    def __init__(self, directory: Path, adapter: EngineAdapter, gateway: Gateway) -> None:
        self.dir = directory
        self.adapter = adapter
        self.gw = gateway
        self.sdk_clients = []

    def openai(self, token: str | None = None) -> openai.OpenAI:
        return self.sdk(token, timeout=120)


@contextmanager
def running_engine_stack(
    directory: Path,
    adapter: EngineAdapter,
    *,
    policy: dict[str, Any] | None = None,
    **sections: Any,
) -> Iterator[EngineStack]:
    """A gateway (in-process uvicorn) in front of ``adapter``; ``policy`` goes into
    both tenants' policies, ``sections`` as ``write_config``."""
    # The engine keeps both cores busy while it decodes: a readiness poll may
    # take longer than the simulator's one second.
    upstream = {
        "route": adapter.route,
        "readiness_timeout_s": 10,
        **sections.pop("upstream", {}),
    }
    config = write_config(
        directory,
        upstream_port=adapter.port,
        policies=engine_policies(adapter.route, **(policy or {})),
        issuers=issuers(),
        upstream=upstream,
        **sections,
    )
    with Gateway(config) as gateway:
        assert gateway.wait_ready(), "the gateway never saw the engine adapter ready"
        stack = EngineStack(directory, adapter, gateway)
        try:
            yield stack
        finally:
            stack.close_clients()


# -- exchanges both ways: through the gateway, and straight to the adapter ------


@dataclass
class Answer:
    """One streamed exchange: status, headers, the parsed body."""

    status: int
    headers: httpx.Headers
    stream: Stream

    @property
    def request_id(self) -> str:
        return self.headers["x-request-id"]


def stream_raw(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    """POST a streaming chat request; the whole body, parsed strictly (``parse_sse``)."""
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json={**body, "stream": True},
        headers=headers or {},
        timeout=120,
    ) as response:
        raw = b"".join(response.iter_raw())
    return Answer(response.status_code, response.headers, parse_sse(raw))


def post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """POST a non-streaming chat request; the parsed JSON answer (status 200 asserted)."""
    response = httpx.post(
        url + "/v1/chat/completions",
        json={**body, "stream": False},
        headers=headers or {},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return json.loads(response.content)


def gateway_body(body: dict[str, Any]) -> dict[str, Any]:
    """The same request addressed to the gateway (its alias)."""
    return {**body, "model": ALIAS}


def worker_bytes(caller_raw: bytes, route: str, receipt: dict[str, Any]) -> bytes:
    """The caller's SSE body with the alias put back to the worker's model id and
    the gateway's id to the worker's (the receipt's ``upstream_id``, spec §21):
    what the worker sent, if the gateway changed nothing else (the receipt's
    ``stream_sha256`` is the SHA-256 of those bytes)."""
    alias = b'"model":' + json.dumps(ALIAS).encode() + b","
    model = b'"model":' + json.dumps(route).encode() + b","
    first = json.loads(caller_raw.split(b"data: ", 1)[1].split(b"\n", 1)[0])
    ours = b'"id":' + json.dumps(first["id"]).encode() + b","
    theirs = b'"id":' + json.dumps(receipt["upstream_id"]).encode() + b","
    return caller_raw.replace(alias, model).replace(ours, theirs)
