"""``create_app()``: routes, the one middleware, lifespan → ``app.state.runtime``.

Only the routes below exist; every worker admin route (model reload/unload,
LoRA, agent approvals, files, UI…) is unreachable by construction.
The middleware is pure ASGI (``BaseHTTPMiddleware`` would hide client
disconnects from streaming handlers).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.asgi import Receive, RequestInfo, Scope, Send, request_id_from
from gateway.config import CorsConfig
from gateway.errors import GatewayError
from gateway.loader import Loaded
from gateway.proxy import InferenceEndpoint
from gateway.routes import evidence_item, evidence_upload, livez, metrics, models, readyz
from gateway.runtime import Runtime, build_runtime, close_runtime

access_log = logging.getLogger("gateway.access")

RawHandler = Callable[[Scope, Receive, Send], Awaitable[None]]
_CORS_METHODS = b"GET, POST, DELETE, OPTIONS"
_CORS_HEADERS = b"authorization, content-type, x-request-id, x-evidence-locator"
_CORS_EXPOSE = (
    b"x-request-id, retry-after, x-ratelimit-limit-requests, x-ratelimit-remaining-requests, "
    b"x-ratelimit-reset-requests, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, "
    b"x-ratelimit-reset-tokens"
)


class _Raw:
    """Mark a plain ``(scope, receive, send)`` function as an ASGI app for Route."""

    def __init__(self, handler: RawHandler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


class GatewayMiddleware:
    """Request id, exact-origin CORS, one access-log line and request metrics."""

    def __init__(self, app: Any, cors: CorsConfig) -> None:
        self.app = app
        self.origins = frozenset(o.encode() for o in cors.allow_origins)
        self.max_age = str(cors.max_age_s).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        info = RequestInfo(request_id_from(scope), time.monotonic())
        scope.setdefault("state", {})["gateway"] = info
        origins = [v for k, v in scope["headers"] if k == b"origin"]
        origin = origins[0] if len(origins) == 1 and origins[0] in self.origins else None
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            cors = [
                (b"access-control-allow-origin", origin),
                (b"vary", b"Origin"),
                (b"access-control-expose-headers", _CORS_EXPOSE),
            ]
        rid = info.request_id.encode()

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                info.status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                headers.append((b"x-request-id", rid))
                headers.extend(cors)
                message = {**message, "headers": headers}
            await send(message)

        try:
            if scope["method"] == "OPTIONS":
                await self._preflight(origin, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            self._record(scope, info)

    async def _preflight(self, origin: bytes | None, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = []
        if origin is not None:
            headers = [
                (b"access-control-allow-methods", _CORS_METHODS),
                (b"access-control-allow-headers", _CORS_HEADERS),
                (b"access-control-max-age", self.max_age),
            ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def _record(self, scope: Scope, info: RequestInfo) -> None:
        elapsed = time.monotonic() - info.started
        app = scope.get("app")
        runtime: Runtime | None = getattr(getattr(app, "state", None), "runtime", None)
        if runtime is not None:
            metrics = runtime.metrics
            metrics.requests.labels(info.tenant, info.endpoint, str(info.status)).inc()
            metrics.duration.labels(info.endpoint).observe(elapsed)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "request",
                extra={
                    "request_id": info.request_id,
                    "tenant": info.tenant,
                    "route": info.endpoint,
                    "method": scope["method"],
                    "status": info.status,
                    "outcome": info.outcome,
                    "error_code": info.error_code,
                    "duration_ms": round(elapsed * 1000, 3),
                },
            )


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "method_not_allowed" if exc.status_code == 405 else "not_found"
    return _error_response(GatewayError(code))


async def _unexpected(request: Request, exc: Exception) -> Response:
    logging.getLogger("gateway").error("unhandled error: %s", type(exc).__name__)
    return _error_response(GatewayError("internal_error"))


def _error_response(exc: GatewayError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.response_headers())


def create_app(loaded: Loaded) -> Starlette:
    config = loaded.config

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime = await build_runtime(loaded)
        app.state.runtime = runtime
        runtime.readiness.start()
        await runtime.readiness.wait_first_poll(config.upstream.readiness_timeout_s + 0.5)
        try:
            yield
        finally:
            await close_runtime(runtime)

    routes = [
        Route("/v1/chat/completions", InferenceEndpoint("chat.completions"), methods=["POST"]),
        Route("/v1/completions", InferenceEndpoint("completions"), methods=["POST"]),
        Route("/v1/models", _Raw(models), methods=["GET"]),
        Route("/v1/evidence", _Raw(evidence_upload), methods=["POST"]),
        Route("/v1/evidence/{evidence_id}", _Raw(evidence_item), methods=["GET", "DELETE"]),
        Route("/livez", _Raw(livez), methods=["GET"]),
        Route("/readyz", _Raw(readyz), methods=["GET"]),
        Route(config.metrics.path, _Raw(metrics), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
    )
    app.add_middleware(GatewayMiddleware, cors=config.cors)
    return app
