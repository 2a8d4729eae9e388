"""A dialect's stream grammar with the agentic events beside it (spec §22 "Events"). Pure.

:class:`AgentStream` is a :class:`~gateway.core.sse.Grammar`: put under the
SSE framing (``StreamValidator(framing, AgentStream(...))``) it hands unnamed
events to the dialect's grammar (the chat chunk grammar) and named ones to
:class:`~gateway.apis.agents.events.AgentEvents`, and tells the machine of
each chunk (``on_content``) and of the chunk that ends the answer
(``finish``). So one validator yields the dialect's items and typed agentic
events in stream order; the relay acts on an
:class:`~gateway.apis.agents.wire.ApprovalRequired` (rules, the caller, the
post) and calls ``on_decision`` before it asks for the next event.

EOF before the terminator is the framing's ``upstream_unavailable``; when
the machine is then inside a round, the relay reports :meth:`AgentStream.eof`
instead (a stream that ends inside a round is ``upstream_protocol_error``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from gateway.apis.agents.events import AgentEvent, AgentEvents
from gateway.core.errors import GatewayError
from gateway.core.sse import Grammar

__all__ = ["AgentStream"]

T = TypeVar("T")


class AgentStream(Generic[T]):
    """The dialect's grammar and the agentic machine over one stream."""

    def __init__(
        self, inner: Grammar[T], agent: AgentEvents, is_final: Callable[[T], bool]
    ) -> None:
        self.inner = inner
        self.agent = agent
        self._is_final = is_final

    @property
    def terminated(self) -> bool:
        return self.inner.terminated

    def on_event(self, name: str | None, data: str) -> T | AgentEvent | None:
        if name is not None:
            return self.agent.on_event(name, data)
        item = self.inner.on_event(None, data)
        if item is not None:
            self.agent.on_content()
            if self._is_final(item):
                self.agent.finish()
        elif self.inner.terminated:
            self.agent.finish()
        return item

    def eof(self, error: GatewayError) -> GatewayError:
        """The error to report for the framing's EOF ``error``: the machine's
        own when the stream ended inside a round, else ``error``."""
        try:
            self.agent.finish()
        except GatewayError as inside:
            return inside
        return error
