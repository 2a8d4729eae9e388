"""Request tracing: the seam the pipeline reports spans through. Pure.

Off by default: every request carries :data:`NO_SPAN`; the pipeline checks
for it before building a step's span or a request's attributes, so a gateway
without tracing pays an identity test per step.
With the ``otel`` extra installed and ``OTEL_TRACES_EXPORTER`` set
(:func:`settings_from_env`), ``gateway/observe/otel.py`` provides the same protocol
on the OpenTelemetry SDK.

What a span may carry is stricter than the receipts' rule: counts, names,
codes and identifiers, never prompt or answer text, tokens or paths (so not
the route either: a route is the model's directory)
(``gateway.pipeline.spans.request_attributes`` is the one place that picks them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gateway.core.errors import GatewayError

AttributeValue = str | int | float | bool | Sequence[str]
Attributes = Mapping[str, AttributeValue | None]
Kind = Literal["server", "internal", "client"]

#: attribute namespace of what the GenAI and HTTP conventions have no name for
NS = "mistralrs_gateway."
#: ``gen_ai.provider.name``: the worker's software (no well-known value names it)
PROVIDER = "mistral.rs"
_EXPORTERS = frozenset({"otlp", "console"})
_PROTOCOLS = frozenset({"http/protobuf"})


class Span(Protocol):
    """One started span; :meth:`end` ends it (a second ``end`` does nothing)."""

    def child(
        self, name: str, *, kind: Kind = "internal", attributes: Attributes | None = None
    ) -> Span:
        """A started span under this one."""
        ...

    def set(self, attributes: Attributes) -> None:
        """Add attributes (``None`` values are left out)."""
        ...

    def traceparent(self) -> bytes | None:
        """This span's W3C ``traceparent`` header value, for the next hop."""
        ...

    def end(
        self, *, name: str | None = None, error: str | None = None, failed: bool = False
    ) -> None:
        """End it, renamed to ``name`` if given; ``error`` becomes ``error.type``
        and ``failed`` the span's error status."""
        ...


class Tracing(Protocol):
    def start(self, name: str, headers: Sequence[tuple[bytes, bytes]]) -> Span:
        """A server span for one request, continuing the trace its
        ``traceparent`` header names (a malformed one starts a new trace)."""
        ...

    def close(self, timeout_s: float) -> None:
        """Export what is pending (at most ``timeout_s``) and stop. Blocking."""
        ...


class _NoSpan:
    __slots__ = ()

    def child(
        self, name: str, *, kind: Kind = "internal", attributes: Attributes | None = None
    ) -> Span:
        return self

    def set(self, attributes: Attributes) -> None:
        return None

    def traceparent(self) -> bytes | None:
        return None

    def end(
        self, *, name: str | None = None, error: str | None = None, failed: bool = False
    ) -> None:
        return None


class _NoTracing:
    __slots__ = ()

    def start(self, name: str, headers: Sequence[tuple[bytes, bytes]]) -> Span:
        return NO_SPAN

    def close(self, timeout_s: float) -> None:
        return None


NO_SPAN: Span = _NoSpan()
NO_TRACING: Tracing = _NoTracing()


def step(
    parent: Span, name: str, attributes: Attributes | None = None
) -> contextlib.AbstractContextManager[Span]:
    """A child span around one step of a request; a refusal names its code,
    a cancellation says ``canceled`` (the receipts' spelling)."""
    if parent is NO_SPAN:
        return contextlib.nullcontext(NO_SPAN)
    return _step(parent, name, attributes)


@contextlib.contextmanager
def _step(parent: Span, name: str, attributes: Attributes | None) -> Iterator[Span]:
    span = parent.child(name, attributes=attributes)
    try:
        yield span
    except GatewayError as exc:
        span.end(error=exc.code, failed=exc.status >= 500)
        raise
    except BaseException as exc:
        # By name: this pure module imports no asyncio.
        canceled = type(exc).__name__ == "CancelledError"
        span.end(error="canceled" if canceled else type(exc).__name__, failed=not canceled)
        raise
    span.end()


def failed(status: int, error_code: str | None) -> bool:
    """A request span's error status: a gateway or worker failure (5xx), or an
    error after a 200 head (a stream ended by an error event). A refusal the
    caller caused (4xx) names its ``error.type`` but is not the server's error."""
    return error_code is not None and (status >= 500 or status < 400)


@dataclass(frozen=True)
class TracingSettings:
    """What the ``OTEL_*`` environment asks for; ``exporters`` empty means off."""

    exporters: tuple[str, ...] = ()
    #: why something asked for is not done, one line each (no values but names)
    warnings: tuple[str, ...] = field(default=())

    @property
    def enabled(self) -> bool:
        return bool(self.exporters)


def settings_from_env(environ: Mapping[str, str]) -> TracingSettings:
    """Tracing is on only when ``OTEL_TRACES_EXPORTER`` names an exporter.

    Unlike the SDK's own default (``otlp``), an unset variable means off: a
    gateway must not start sending spans because a library was installed.
    Everything else (endpoint, headers, sampler, batch sizes, resource) is read
    by the SDK from the standard variables.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return TracingSettings()
    asked = [
        name.strip().lower()
        for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if name.strip()
    ]
    if not asked or asked == ["none"]:
        return TracingSettings()
    warnings = [
        f"OTEL_TRACES_EXPORTER: {name!r} is not supported (otlp, console, none)"
        for name in asked
        if name not in _EXPORTERS and name != "none"
    ]
    exporters = [name for name in dict.fromkeys(asked) if name in _EXPORTERS]
    if "otlp" in exporters:
        protocol = environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        ).strip()
        if protocol and protocol not in _PROTOCOLS:
            warnings.append(
                f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (http/protobuf)"
            )
            exporters.remove("otlp")
    return TracingSettings(tuple(exporters), tuple(warnings))
