"""The readiness probe (spec §16): one small request for a route through the full validator.

Run by the readiness poll after a route became ``loaded`` (never on a
request's path). It is an ordinary request of the route's kind -- a
streamed one-token chat completion, or an embedding (``probe.kind``, or the
route's own kind ``embeddings``) -- read by the same
dialect and relay as callers' requests, within ``probe.timeout_s``: a route
passes only if the worker's answer passed every rule a caller's would.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import orjson

from gateway.apis.base import Api, Plan, StreamBounds
from gateway.apis.chat.api import ChatApi
from gateway.apis.embeddings.api import EmbeddingsApi
from gateway.core.errors import GatewayError
from gateway.pipeline.cancel import CallerStalled
from gateway.pipeline.relay import Relay, Timeouts
from gateway.upstream.table import Worker

log = logging.getLogger("gateway.readiness")


def _request(route: str, kind: str, prompt: str, max_tokens: int) -> tuple[Api, dict[str, Any]]:
    if kind == "embeddings":
        return EmbeddingsApi(), {"model": route, "input": prompt}
    body = {
        "model": route,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
    }
    return ChatApi(), body


async def probe(worker: Worker, route: str) -> bool:
    config = worker.config
    assert config.probe is not None
    settings = config.probe
    kind = "embeddings" if config.route_kinds[route] == "embeddings" else settings.kind
    api, body = _request(route, kind, settings.prompt, settings.max_tokens)
    plan = Plan(
        endpoint=api.endpoint.name,
        alias=route,
        body=body,
        stream=False,
        include_usage=True,
        max_tokens=settings.max_tokens if api.endpoint.exchange == "sse" else None,
        prompt_bytes=len(settings.prompt),
        nonce="probe",
    )
    bounds = StreamBounds(framing=config.framing, text_nul=config.text_nul)
    dialect = api.dialect(plan, bounds, collect=True)
    limit = settings.timeout_s
    relay = Relay(dialect, timeouts=Timeouts(limit, limit, limit), response_headers=[])
    request_id = "probe-" + os.urandom(8).hex()
    try:
        await relay.collect(
            lambda: worker.client.open_stream(
                api.endpoint.path, orjson.dumps(body), request_id, accept=api.endpoint.exchange
            )
        )
    except (GatewayError, CallerStalled) as exc:
        code = exc.code if isinstance(exc, GatewayError) else "timeout"
        log.warning("probe of route %s on upstream %s failed: %s", route, worker.name, code)
        return False
    finally:
        relay.close()
    return True
