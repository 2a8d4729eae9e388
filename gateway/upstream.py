"""The only place that talks to the worker over HTTP (httpx).

:class:`Upstream` sends a rewritten inference body and returns an open
:class:`UpstreamStream` once the worker's response head has been checked, or
raises a :class:`GatewayError` classified per spec §12 ("before the first
byte"). It also serves the readiness poll. Only a fixed set of headers is ever
sent: the caller's credentials and hop-by-hop headers never leave the
gateway, redirects are never followed and no content decoding is accepted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from gateway.config import UpstreamConfig
from gateway.errors import GatewayError


class UpstreamStream:
    """An open worker response whose head passed the checks."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    @property
    def closed(self) -> bool:
        # httpx closes a response itself once its body has been read to the end.
        return self.response.is_closed

    def raw(self) -> AsyncIterator[bytes]:
        # aiter_raw: de-chunked but undecoded bytes, exactly what the worker sent.
        return self.response.aiter_raw()

    async def aclose(self) -> None:
        await self.response.aclose()


class Upstream:
    def __init__(
        self,
        config: UpstreamConfig,
        *,
        pool_size: int = 32,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config
        self._client = client or httpx.AsyncClient(
            base_url=config.base_url,
            # Per-read timeouts are the stream pump's job (first event, idle,
            # total); httpx only bounds connecting and writing.
            timeout=httpx.Timeout(
                connect=config.connect_timeout_s,
                read=None,
                write=config.connect_timeout_s * 5,
                pool=config.connect_timeout_s,
            ),
            limits=httpx.Limits(
                max_connections=pool_size,
                max_keepalive_connections=pool_size,
                keepalive_expiry=30,
            ),
            follow_redirects=False,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def open_stream(self, path: str, body: bytes, request_id: str) -> UpstreamStream:
        request = self._client.build_request(
            "POST",
            path,
            content=body,
            headers={
                "content-type": "application/json",
                "accept": "text/event-stream",
                "accept-encoding": "identity",
                "x-request-id": request_id,
            },
        )
        try:
            response = await self._client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise GatewayError("upstream_unavailable", outcome="upstream_error") from exc
        except httpx.HTTPError as exc:
            raise GatewayError("upstream_unavailable") from exc
        try:
            _check_head(response, request_id)
        except BaseException:
            await response.aclose()
            raise
        return UpstreamStream(response)

    async def get_models(self, timeout_s: float) -> Any:
        response = await self._client.get(
            "/v1/models",
            headers={"accept": "application/json", "accept-encoding": "identity"},
            timeout=timeout_s,
        )
        if response.status_code != 200:
            raise ValueError("models listing failed")
        if len(response.content) > 1_048_576:
            raise ValueError("models listing too large")
        return orjson.loads(response.content)


def _check_head(response: httpx.Response, request_id: str) -> None:
    status = response.status_code
    if 400 <= status < 500:
        raise GatewayError("upstream_rejected")
    if status >= 500:
        raise GatewayError("upstream_error")
    if status != 200:
        # Redirects are never followed: the worker has no reason to send one.
        raise GatewayError("upstream_protocol_error")
    content_type = response.headers.get("content-type", "")
    if not content_type.lower().startswith("text/event-stream"):
        raise GatewayError("upstream_protocol_error")
    if response.headers.get("content-encoding", "identity").lower() != "identity":
        raise GatewayError("upstream_protocol_error")
    echoed = response.headers.get("x-request-id")
    # Releases before 0.8.12 send no echo; a different one means a crossed response.
    if echoed is not None and echoed != request_id:
        raise GatewayError("upstream_protocol_error")


def models_status(listing: Any, route: str) -> str | None:
    """The route's status when it appears exactly once, else None (readiness, /v1/models)."""
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        return None
    entries = [e for e in listing["data"] if isinstance(e, dict) and e.get("id") == route]
    if len(entries) != 1:
        return None
    status = entries[0].get("status")
    return status if isinstance(status, str) else None
