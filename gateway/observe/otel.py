"""The tracing seam on the OpenTelemetry SDK (the optional ``otel`` extra).

Imported only when :func:`gateway.observe.tracing.settings_from_env` turns tracing
on. The tracer provider is the gateway's own, never the process-global one,
so tests and embedders keep theirs. The SDK reads the standard variables
itself: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (the service
name defaults to ``mistralrs-gateway`` here), ``OTEL_TRACES_SAMPLER(_ARG)``,
``OTEL_BSP_*`` and ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout,
certificate).

Only W3C trace context is read from callers and sent to the worker, and of
it only ``traceparent``: a caller's ``tracestate`` and baggage are theirs
and never cross the gateway (``OTEL_PROPAGATORS`` is therefore not read).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.observe.tracing import Attributes, Kind, Span, TracingSettings

_KINDS = {"server": SpanKind.SERVER, "internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACEPARENT = b"traceparent"


def _clean(attributes: Attributes | None) -> dict[str, object]:
    if not attributes:
        return {}
    return {k: v for k, v in attributes.items() if v is not None}


class OtelSpan:
    __slots__ = ("_context", "_ended", "_span", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self._span = span
        self._context = trace.set_span_in_context(span)
        self._ended = False

    def child(
        self, name: str, *, kind: Kind = "internal", attributes: Attributes | None = None
    ) -> Span:
        span = self._tracer.start_span(
            name,
            context=self._context,
            kind=_KINDS[kind],
            attributes=_clean(attributes),  # type: ignore[arg-type]
        )
        return OtelSpan(self._tracer, span)

    def set(self, attributes: Attributes) -> None:
        self._span.set_attributes(_clean(attributes))  # type: ignore[arg-type]

    def traceparent(self) -> bytes | None:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=self._context)
        value = carrier.get("traceparent")
        return value.encode("ascii") if value else None

    def end(
        self, *, name: str | None = None, error: str | None = None, failed: bool = False
    ) -> None:
        if self._ended:
            return
        self._ended = True
        if name is not None:
            self._span.update_name(name)
        if error is not None:
            self._span.set_attribute("error.type", error)
        if failed:
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()


class OtelTracing:
    def __init__(self, processors: Sequence[SpanProcessor], version: str) -> None:
        # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME;
        # without either it names the service "unknown_service…".
        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "mistralrs-gateway"}))
        # No atexit shutdown of its own: close() bounds it; the SDK's would wait
        # for a hanging collector after the drain had already given up on it.
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in processors:
            self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer("mistralrs-gateway", version)

    def start(self, name: str, headers: Sequence[tuple[bytes, bytes]]) -> Span:
        values = [v for k, v in headers if k == _TRACEPARENT]
        parent: Context | None = None
        if len(values) == 1:
            # The propagator checks the format; a malformed value starts a new trace.
            parent = _PROPAGATOR.extract({"traceparent": values[0].decode("latin-1")})
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER)
        return OtelSpan(self._tracer, span)

    def close(self, timeout_s: float) -> None:
        """Export what is batched, for at most ``timeout_s``.

        In a daemon thread: the SDK's flush waits for every batch whatever its
        timeout, each export for the exporter's timeout, and a collector that
        accepts and never answers would hold the process past its termination
        grace. What is not exported by then is left behind."""

        def flush_and_stop() -> None:
            self.provider.force_flush(int(timeout_s * 1000))
            self.provider.shutdown()

        closer = threading.Thread(target=flush_and_stop, name="otel-close", daemon=True)
        closer.start()
        closer.join(timeout_s)


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    # The exporter's own endpoint, headers, timeout and certificate variables apply.
    return OTLPSpanExporter()


def from_settings(settings: TracingSettings, version: str) -> OtelTracing:
    """A batch processor per exporter the settings name (``OTEL_BSP_*`` apply)."""
    return OtelTracing([BatchSpanProcessor(_exporter(n)) for n in settings.exporters], version)
