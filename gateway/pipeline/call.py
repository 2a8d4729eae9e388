"""One inference request's state, in the order it becomes known.

A :class:`Call` is made at the edge (who asks, the receipt, the cancel
scope). Planning adds its :class:`~gateway.apis.base.Plan`; resolving adds a
:class:`Routed` (the route's worker, then what the request takes before the
worker: evidence records, the rate reservation, the admission permit); the
worker call adds an :class:`Attempt` (the dialect, the relay and the body
producer, made together). The one ``finally`` (``settle.py``) gives back
whatever of these exists, so it tests three stages rather than every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.admission import Permit
from gateway.apis.base import Dialect, Plan
from gateway.apis.usage import Usage
from gateway.books.evidence.encode import BodyProducer
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.receipts import Receipt
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError
from gateway.core.outcome import Facts
from gateway.observe.access import RequestInfo
from gateway.observe.tracing import Span
from gateway.pipeline.agents import AgentRun
from gateway.pipeline.cancel import Exchange
from gateway.pipeline.relay import Relay
from gateway.pipeline.services import RequestEvidence, Services
from gateway.pipeline.timings import Timings
from gateway.ratelimit.base import Hold
from gateway.types import Send
from gateway.upstream.table import Resolved, Worker


@dataclass(eq=False)
class Routed:
    """The request's route, resolved once, and what it holds before the worker."""

    resolved: Resolved
    #: media slot -> its record (named evidence before admission, inline data after)
    records: dict[int, EvidenceRecord] = field(default_factory=dict)
    reservation: Hold | None = None
    permit: Permit | None = None

    @property
    def worker(self) -> Worker:
        return self.resolved.worker


@dataclass(eq=False)
class Attempt:
    """One worker call (a release's fallback makes a second): the answer's
    reader, its pump and the body being sent."""

    dialect: Dialect
    relay: Relay
    producer: BodyProducer
    #: the worker call's span: ended when the worker's response is closed
    span: Span | None = None
    #: counted in its worker's live requests (from sending until the end)
    live: bool = False
    #: an agentic call's run: the gateway's decisions on its tool calls (spec §22)
    agent: AgentRun | None = None


@dataclass(eq=False)
class Call:
    services: Services
    info: RequestInfo
    send: Send
    tenant: Tenant
    receipt: Receipt
    exchange: Exchange
    #: the evidence the request holds (leases, staged inline data)
    media: RequestEvidence
    timings: Timings
    facts: Facts = field(default_factory=Facts)
    plan: Plan | None = None
    routed: Routed | None = None
    attempt: Attempt | None = None
    #: the settled usage of a collected answer (a stream's is read at the end)
    usage: Usage | None = None
    #: a Responses id the caller was shown: recorded as the tenant's
    relayed_response: str | None = None

    @property
    def relay(self) -> Relay | None:
        return self.attempt.relay if self.attempt is not None else None

    def fail(self, exc: GatewayError) -> None:
        self.facts.error_code, self.facts.error_outcome = exc.code, exc.outcome
        self.info.error_code = exc.code
