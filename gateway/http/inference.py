"""The edge of every inference endpoint: one raw ASGI handler per descriptor.

It authenticates, opens the request's receipt and cancel scope, authorizes,
reads the body under the tenant's bounds and plans it (the descriptor:
allowlist, bounds, media parts); refusals until then are ordinary HTTP
errors. The pipeline (``gateway/pipeline``) runs the rest inside the cancel
scope (``gateway/pipeline/cancel.py``); its one ``finally``
(``gateway/pipeline/settle.py``) releases everything and writes the receipt,
whatever happened.
"""

from __future__ import annotations

import asyncio
import os
import time

from gateway.apis.base import Api, PlanContext
from gateway.auth.authenticator import authorize
from gateway.auth.principal import Principal
from gateway.books.evidence.leases import RequestMedia
from gateway.books.receipts import Receipt
from gateway.core.errors import GatewayError
from gateway.http.asgi import (
    ABORT_EXTENSION,
    DISCONNECT_EXTENSION,
    authorization_values,
    info_of,
    runtime_of,
    send_error,
)
from gateway.http.bodyguard import ClientDisconnected, parse_json, read_body
from gateway.http.bodywriter import BODY_EXTENSION
from gateway.http.runtime import Runtime
from gateway.pipeline import steps
from gateway.pipeline.call import Call
from gateway.pipeline.cancel import LAST_WORDS_S, CallerStalled, Exchange, watch_disconnect
from gateway.pipeline.settle import finish
from gateway.pipeline.timings import Timings, now
from gateway.types import Receive, Scope, Send


class InferenceEndpoint:
    """The raw ASGI handler of one descriptor's path."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.path = api.endpoint.path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt = runtime_of(scope)
        info = info_of(scope)
        info.endpoint = self.api.endpoint.name
        policies = rt.policies  # one snapshot for the whole request (reloads swap it)
        began = now()
        try:
            principal = await rt.auth.authenticate(authorization_values(scope), policies)
        except GatewayError as exc:
            await send_error(send, exc, info, self.api.endpoint.error_shape)
            return
        timings = Timings(info.started, auth=now() - began)
        tenant = policies.tenants[principal.tenant]
        info.tenant = tenant.name
        receipt = Receipt(
            request_id=info.request_id,
            tenant=tenant.name,
            subject=principal.subject,
            endpoint=self.api.endpoint.name,
            serve_identity=None,
            created=time.time(),
        )
        extensions = scope.get("extensions", {})
        exchange = Exchange(
            abort=extensions.get(ABORT_EXTENSION), body_writer=extensions.get(BODY_EXTENSION)
        )
        media = RequestMedia(rt.evidence, tenant)
        call = Call(rt.services, info, send, tenant, receipt, exchange, media, timings)
        rt.inflight.add(exchange)
        try:
            ended = await exchange.run(lambda: self._serve(call, rt, scope, receive, principal))
            if not ended and exchange.shutdown and not exchange.disconnected:
                await _end_for_shutdown(call, self.api.endpoint.error_shape)
        except Exception:
            # A bug: the app answers 500; the receipt says what is known.
            call.facts.internal = True
            raise
        finally:
            await finish(call, self.api)

    async def _serve(
        self, call: Call, rt: Runtime, scope: Scope, receive: Receive, principal: Principal
    ) -> None:
        tenant, info = call.tenant, call.info
        began = now()
        try:
            authorize(principal, tenant, self.api.endpoint.policy_endpoint, self.api.endpoint.scope)
            rt.check_serving()
            body = await read_body(
                scope, receive, tenant.limits.max_body_bytes, rt.config.listen.body_timeout_s
            )
            config = rt.config
            plan = self.api.plan(
                parse_json(body, tenant.limits.max_json_depth),
                PlanContext(
                    tenant,
                    os.urandom(8).hex(),
                    tuple(scope["headers"]),
                    config.images,
                    config.speech,
                    config.server.public_base_url,
                    route_agents=rt.table.agents_for,
                    session_key=rt.services.session_key,
                ),
            )
            call.plan = plan
            routed = steps.resolve(call, plan, self.api.endpoint)
        except ClientDisconnected:
            call.exchange.disconnected = True
            return
        except GatewayError as exc:
            call.fail(exc)
            await send_error(call.send, exc, info, self.api.endpoint.error_shape)
            return
        finally:
            call.timings.plan = now() - began

        watch = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
        if watch is not None:
            # The listener's own watch: no task per request (gateway/http/protocol.py).
            stop_watching = watch(call.exchange.cancel)
        else:
            stop_watching = asyncio.create_task(watch_disconnect(receive, call.exchange)).cancel
        try:
            await steps.run(call, routed, self.api, plan)
        except GatewayError as exc:
            call.fail(exc)
            relay = call.relay
            if relay is None or not relay.state.headers_sent:
                await send_error(call.send, exc, info, self.api.endpoint.error_shape)
        except CallerStalled:
            call.exchange.stall()
        finally:
            stop_watching()


async def _end_for_shutdown(call: Call, shape: str) -> None:
    """Past the drain grace: end the request with upstream_unavailable (spec §11)."""
    exc = GatewayError("upstream_unavailable")
    call.info.error_code = exc.code
    relay = call.relay
    if relay is not None and relay.state.finished:
        return
    if relay is not None and relay.state.headers_sent:
        await relay.end_with_error(call.send, exc, LAST_WORDS_S)
        return
    try:
        # A caller that stopped reading must not hold the drain.
        async with asyncio.timeout(LAST_WORDS_S):
            await send_error(call.send, exc, call.info, shape)
    except TimeoutError:
        call.exchange.drop_connection()
