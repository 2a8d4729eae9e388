"""What passes between the connection (transport.py) and the core (core.py).

``Incoming`` is one parsed request, handed from the connection to the core.
``Channel`` is what the core needs of a connection to answer it: mark the
request being played, play a plan, and shut the connection at the end. The
core names only this protocol, never ``transport.Connection``, so the
connection can depend on the core without the core depending back on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import Step
from gateway.testing.simulator.state import SimRequest


@dataclass(slots=True)
class Incoming:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool
    refusal: tuple[int, str] | None = None


class Channel(Protocol):
    """One client connection as the core sees it (``transport.Connection`` is one)."""

    def begin(self, req: SimRequest, *, cancel_on_lost: bool) -> None:
        """``req`` is being answered; a lost client cancels it if ``cancel_on_lost``."""
        ...

    def end(self) -> None:
        """The answer to the request of the last :meth:`begin` is over."""
        ...

    async def play(self, plan: Iterator[Step], knobs: SimKnobs | None, keep_alive: bool) -> bool:
        """Write a plan. True when the response ended cleanly and the connection may stay."""
        ...

    def shutdown(self) -> None:
        """Drop the connection now (the simulator is stopping)."""
        ...
