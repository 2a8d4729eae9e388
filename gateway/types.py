"""The ASGI types every layer names, so that nothing imports the edge to name ``Send``.

As ``starlette/types.py``: importing them never imports the edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
