"""The ASGI types every layer names, so that nothing imports the edge to name ``Send``.

As ``starlette/types.py``: importing them never imports the edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyWriter(Protocol):
    """The listener's direct writer of a streamed response's body frames
    (``gateway/http/bodywriter.py``): what ``send`` does for a body message
    with ``more_body``, without the layers in between."""

    def ready(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    async def drain(self) -> None: ...

    def write(self, body: bytes) -> None: ...
