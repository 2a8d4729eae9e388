"""``create_app()``: the ASGI app, its routes and lifespan → ``app.state.runtime``.

Only the routes below exist; every worker admin route (model reload/unload,
LoRA, agent approvals, files, UI…) is unreachable by construction.
The request wrapper is pure ASGI (``BaseHTTPMiddleware`` would hide client
disconnects from streaming handlers).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.apis import APIS
from gateway.config import CorsConfig
from gateway.config.loader import Loaded
from gateway.core.errors import GatewayError
from gateway.http.asgi import header, info_of, request_id_from, send_error
from gateway.http.evidence_api import evidence_collection, evidence_item
from gateway.http.inference import InferenceEndpoint
from gateway.http.responses_api import response_cancel, response_input_items, response_item
from gateway.http.routes import livez, metrics, models, readyz
from gateway.http.runtime import Runtime, build_runtime, close_runtime, start_background
from gateway.http.signed_files import signed_file_content
from gateway.observe.access import RequestInfo
from gateway.observe.logs import access_writer
from gateway.observe.tracing import NO_SPAN, NS, Tracing, failed
from gateway.pipeline.timings import ms
from gateway.types import Receive, Scope, Send

access_log = logging.getLogger("gateway.access")
auth_log = logging.getLogger("gateway.auth")

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


class _ResponseHeaders:
    """The one ``send`` wrapper: x-request-id (and ``request-id`` on the
    Anthropic paths) and CORS on every response start.

    Body messages pass straight through; this is the only wrapper a streamed
    chunk crosses between the relay and uvicorn.
    """

    __slots__ = ("extra", "info", "send")

    def __init__(self, send: Send, info: RequestInfo, extra: list[tuple[bytes, bytes]]) -> None:
        self.send = send
        self.info = info
        self.extra = extra

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.info.status = message["status"]
            message = {**message, "headers": [*message.get("headers", ()), *self.extra]}
        await self.send(message)


class GatewayApp:
    """The ASGI app uvicorn serves: request id, exact-origin CORS, one access-log
    line and request metrics for every request.

    ``POST`` to an inference route goes straight to its endpoint: the profile
    showed Starlette's router and its two exception middlewares costing a
    fifth of a streamed request's CPU, most of it in the per-chunk ``send``
    wrappers. Everything else (the small routes, 404/405, lifespan) goes
    through the Starlette app, whose ``state`` this app shares.
    """

    def __init__(
        self, router: Starlette, inference: dict[str, RawHandler], cors: CorsConfig
    ) -> None:
        # Starlette types messages as MutableMapping; ours are plain dicts.
        self.router = cast(RawHandler, router)
        self.state = router.state
        self.inference = inference
        self.origins = frozenset(o.encode() for o in cors.allow_origins)
        self.max_age = str(cors.max_age_s).encode()
        self.access = access_writer(access_log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.router(scope, receive, send)
            return
        info = RequestInfo(request_id_from(scope), time.monotonic())
        scope.setdefault("state", {})["gateway"] = info
        runtime: Runtime | None = getattr(self.state, "runtime", None)
        if runtime is not None and scope["path"].startswith("/v1/"):
            # Probes and scrapes make no spans; every API request does.
            info.span = runtime.tracing.start(scope["method"], scope["headers"])
        origin = self._origin(scope)
        request_id = info.request_id.encode()
        extra = [(b"x-request-id", request_id)]
        if scope["path"].startswith(ANTHROPIC_PREFIX):
            # The Anthropic SDKs read their request_id from this one (spec §24).
            extra.append((b"request-id", request_id))
        if origin is not None:
            extra += [
                (b"access-control-allow-origin", origin),
                (b"vary", b"Origin"),
                (b"access-control-expose-headers", _CORS_EXPOSE),
            ]
        wrapped = _ResponseHeaders(send, info, extra)
        try:
            method = scope["method"]
            if method == "OPTIONS":
                await self._preflight(origin, wrapped)
                return
            handler = self.inference.get(scope["path"]) if method == "POST" else None
            if handler is None:
                await self.router(scope, receive, wrapped)
                return
            scope["app"] = self
            try:
                await handler(scope, receive, wrapped)
            except Exception as exc:
                # What Starlette's ServerErrorMiddleware does for the other routes.
                _log_unexpected(exc)
                if info.status == 0:
                    await send_error(wrapped, GatewayError("internal_error"), info)
        finally:
            self._record(scope, info, runtime)

    def _origin(self, scope: Scope) -> bytes | None:
        origins = header(scope, b"origin")
        if len(origins) == 1 and origins[0] in self.origins:
            return origins[0]
        return None

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

    def _record(self, scope: Scope, info: RequestInfo, runtime: Runtime | None) -> None:
        elapsed = time.monotonic() - info.started
        if info.span is not NO_SPAN:
            _end_span(scope["method"], info)
        if runtime is not None:
            # Every refusal counted in one place, whichever route answered it.
            runtime.metrics.request_done(
                info.tenant, info.endpoint, info.status, elapsed, info.error_code
            )
            if info.auth_failure is not None:
                runtime.metrics.auth_failed(info.auth_failure)
        if info.auth_failure is not None:
            # The reason is for operators; the caller got the generic code.
            auth_log.info(
                "authentication failed: %s",
                info.auth_failure,
                extra={
                    "request_id": info.request_id,
                    "route": info.endpoint,
                    "error_code": info.error_code,
                    "reason": info.auth_failure,
                },
            )
        if access_log.isEnabledFor(logging.INFO):
            self.access(
                {
                    "request_id": info.request_id,
                    "tenant": info.tenant,
                    "route": info.endpoint,
                    "method": scope["method"],
                    "status": info.status,
                    "outcome": info.outcome,
                    "error_code": info.error_code,
                    "duration_ms": ms(elapsed),
                }
            )


def _end_span(method: str, info: RequestInfo) -> None:
    info.span.set(
        {
            "http.request.method": method,
            "http.response.status_code": info.status or None,
            NS + "endpoint": info.endpoint,
            NS + "tenant": info.tenant,
            NS + "request_id": info.request_id,
        }
    )
    info.span.end(
        name=info.span_name or f"{method} {info.endpoint}",
        error=info.error_code,
        failed=failed(info.status, info.error_code),
    )


def _log_unexpected(exc: Exception) -> None:
    # The type only: exception text can carry request data.
    logging.getLogger("gateway").error("unhandled error: %s", type(exc).__name__)


#: paths whose errors are Anthropic-shaped (spec §19), whatever route answers
ANTHROPIC_PREFIX = ("/v1/messages", "/v1/v1/messages")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = GatewayError("method_not_allowed" if exc.status_code == 405 else "not_found")
    if request.url.path.startswith(ANTHROPIC_PREFIX):
        return JSONResponse(
            error.anthropic_body(), status_code=error.status, headers=error.response_headers()
        )
    return _error_response(error)


async def _no_such_route(scope: Scope, receive: Receive, send: Send) -> None:
    await send_error(send, GatewayError("not_found"), info_of(scope))


async def _unexpected(request: Request, exc: Exception) -> Response:
    _log_unexpected(exc)
    return _error_response(GatewayError("internal_error"))


def _error_response(exc: GatewayError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.response_headers())


def create_app(loaded: Loaded, tracing: Tracing | None = None) -> GatewayApp:
    """``tracing`` replaces what the ``OTEL_*`` environment asks for (tests)."""
    config = loaded.config

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime = await build_runtime(loaded, tracing)
        app.state.runtime = runtime
        await start_background(runtime)
        first_poll = max(u.readiness_timeout_s for u in config.workers) + 0.5
        await runtime.readiness.wait_first_poll(first_poll)
        try:
            yield
        finally:
            await close_runtime(runtime)

    inference = {api.endpoint.path: InferenceEndpoint(api) for api in APIS}
    # Anthropic SDKs append /v1/messages to their base URL; one ending in /v1
    # (as OpenAI SDKs want it) must work too (spec §19).
    inference.update(
        {
            "/v1" + api.endpoint.path: inference[api.endpoint.path]
            for api in APIS
            if api.endpoint.error_shape == "anthropic"
        }
    )
    # Listed in the router too, so that other methods on them get a clean 405.
    routes = [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in inference.items()),
        Route("/v1/models", _Raw(models), methods=["GET"]),
        Route("/v1/models/{alias:path}", _Raw(models), methods=["GET"]),
        Route("/v1/evidence", _Raw(evidence_collection), methods=["GET", "POST"]),
        Route("/v1/evidence/{evidence_id}", _Raw(evidence_item), methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}", _Raw(response_item), methods=["GET", "DELETE"]),
        # An item takes no POST: a POST there names an action this gateway does
        # not know (``/v1/responses/compact``), a 404 like any unknown path (§24).
        *(
            Route(path, _Raw(_no_such_route), methods=["POST"])
            for path in (
                "/v1/responses/{response_id}",
                "/v1/evidence/{evidence_id}",
                "/v1/models/{alias:path}",
            )
        ),
        Route("/v1/responses/{response_id}/cancel", _Raw(response_cancel), methods=["POST"]),
        Route(
            "/v1/responses/{response_id}/input_items", _Raw(response_input_items), methods=["GET"]
        ),
        # Interim: the signed links of url images (spec §23), until the files API (§22).
        Route("/v1/files/{file_id}/content", _Raw(signed_file_content), methods=["GET"]),
        Route("/livez", _Raw(livez), methods=["GET"]),
        Route("/readyz", _Raw(readyz), methods=["GET"]),
    ]
    if config.metrics.listen is None:
        # Otherwise /metrics has its own listener (gateway/observe/listener.py).
        routes.append(Route(config.metrics.path, _Raw(metrics), methods=["GET"]))
    router = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
    )
    # No 307 for a trailing slash: its Location would be built from the caller's
    # Host header, and every route here has exactly one spelling.
    router.router.redirect_slashes = False
    return GatewayApp(router, dict(inference), config.cors)
