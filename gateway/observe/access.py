"""What the access log and the request metrics record of one request.

The app's send wrapper (``gateway/http/app.py``) makes one
:class:`RequestInfo` per request; handlers and the pipeline fill it in, and
the wrapper logs and counts it once the response has ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.observe.metrics import UNKNOWN_TENANT
from gateway.observe.tracing import NO_SPAN, Span


@dataclass(slots=True)
class RequestInfo:
    """Per-request facts the middleware logs and counts once the response ends."""

    request_id: str
    started: float
    endpoint: str = "other"
    tenant: str = UNKNOWN_TENANT
    status: int = 0
    outcome: str | None = None
    error_code: str | None = None
    #: the request's trace span (NO_SPAN when tracing is off or for probes)
    span: Span = NO_SPAN
    #: the span's final name when the handler knows a better one than its route
    span_name: str | None = None
    #: why authentication failed (gateway.auth.failures.REASONS), for operators only
    auth_failure: str | None = None
