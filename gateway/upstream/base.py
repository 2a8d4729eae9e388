"""The worker seam: what the gateway needs of a worker's HTTP, as protocols.

httpx's ``BaseTransport`` is the model: the client (here the pipeline, the
readiness poll, the cancel confirmation) owns policy -- bounds, timers,
classification -- and the transport only moves bytes. ``client.Upstream`` is
the real one (a lean wire pool for inference, another for the small
exchanges); tests plug in small fakes of their own, with no cast.

A :class:`WorkerStream` is an open worker response whose head passed the
checks of spec §12: the de-chunked, undecoded body bytes, its ``content_type``
(a binary body's format may live there alone: ``audio/pcm;rate=…``),
``closed`` once read to its end (or closed), and a synchronous ``close()`` so
that a request's one ``finally`` has nothing to await.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

#: what the gateway asks the worker for: an SSE stream, one JSON body, or one
#: audio body (``audio/wav`` or ``audio/pcm``, spec §23)
Accept = Literal["sse", "json", "audio"]
#: what a worker's 4xx becomes: ``upstream_rejected`` (spec §12), or
#: ``invalid_request`` with the worker's message cut to 200 characters (spec §24)
Rejection = Literal["classified", "relayed"]


class WorkerStream(Protocol):
    @property
    def closed(self) -> bool: ...

    @property
    def content_type(self) -> bytes:
        """The response's ``Content-Type`` as the worker sent it (checked for the exchange)."""
        ...

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    def close(self) -> None: ...


class WorkerTransport(Protocol):
    """One worker's HTTP: an inference exchange, and the small bounded ones."""

    async def open_stream(
        self,
        path: str,
        body: bytes | AsyncIterator[bytes],
        request_id: str,
        *,
        size: int | None = None,
        accept: Accept = "sse",
        traceparent: bytes | None = None,
        rejection: Rejection = "classified",
    ) -> WorkerStream:
        """Send one request (its body whole, or in pieces of a known total
        ``size``) and return its response once the head passed the checks; a
        failure before that is a classified ``GatewayError``."""
        ...

    async def get_models(self, timeout_s: float) -> Any:
        """The worker's ``/v1/models`` listing; ``ListingError`` says why not."""
        ...

    async def request_json(
        self, method: str, path: str, request_id: str, timeout_s: float
    ) -> tuple[int, Any]:
        """A small JSON exchange: its status and parsed body, bounded."""
        ...

    async def post_json(
        self, path: str, body: Any, request_id: str, timeout_s: float
    ) -> tuple[int, Any]:
        """A small JSON POST (an approval's decision): its status and parsed answer."""
        ...

    async def get_metrics(self, path: str, timeout_s: float, limit: int) -> tuple[int, bytes]:
        """The worker's Prometheus exposition, bounded in bytes and time."""
        ...

    async def aclose(self) -> None: ...
