"""One inference request's state: what it was given, what it holds until the
one ``finally`` (``settle.py``) gives it back, and the facts its outcome is
decided from."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.admission import Permit
from gateway.apis.base import Dialect, Plan
from gateway.apis.usage import Usage
from gateway.books.evidence.encode import BodyProducer
from gateway.books.evidence.leases import RequestMedia
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.receipts import Receipt
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError
from gateway.core.outcome import Facts
from gateway.observe.access import RequestInfo
from gateway.observe.tracing import Span
from gateway.pipeline.cancel import Exchange
from gateway.pipeline.relay import Relay
from gateway.pipeline.runtime import Runtime
from gateway.pipeline.timings import Timings
from gateway.ratelimit import Hold
from gateway.types import Send
from gateway.upstream.table import Resolved, Worker


@dataclass(eq=False)
class Call:
    rt: Runtime
    info: RequestInfo
    send: Send
    tenant: Tenant
    receipt: Receipt
    exchange: Exchange
    #: the evidence the request holds (leases, staged inline data)
    media: RequestMedia
    timings: Timings
    facts: Facts = field(default_factory=Facts)
    plan: Plan | None = None
    #: the route and its worker, resolved once after planning
    resolved: Resolved | None = None
    permit: Permit | None = None
    reservation: Hold | None = None
    #: media slot -> its record (named evidence before admission, inline data after)
    records: dict[int, EvidenceRecord] = field(default_factory=dict)
    dialect: Dialect | None = None
    relay: Relay | None = None
    producer: BodyProducer | None = None
    usage: Usage | None = None
    #: a Responses id the caller was shown: recorded as the tenant's
    relayed_response: str | None = None
    #: the worker call's span: ended when the worker's response is closed
    worker_span: Span | None = None
    #: counted in its worker's live requests (from sending until the end)
    live: bool = False

    @property
    def worker(self) -> Worker:
        assert self.resolved is not None
        return self.resolved.worker

    def fail(self, exc: GatewayError) -> None:
        self.facts.error_code, self.facts.error_outcome = exc.code, exc.outcome
        self.info.error_code = exc.code
