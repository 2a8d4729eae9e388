"""The worker's agentic events on one chat stream: a sans-I/O state machine
(spec §22 "Events", §24 "rounds"). Pure.

Theory of operation
-------------------

:class:`AgentEvents` sits beside the chat chunk grammar (``chunk_grammar``)
on one stream, as h11 keeps its state apart from its readers. The relay
feeds it what the framing dispatched and what the gateway decided:

* :meth:`~AgentEvents.on_event` -- a named event's data (the raw JSON text);
  returns one typed event (:class:`~gateway.apis.agents.wire.ToolCalling`,
  :class:`~gateway.apis.agents.wire.ApprovalRequired`,
  :class:`FileProduced`, :class:`~gateway.apis.agents.wire.ToolComplete`);
* :meth:`~AgentEvents.on_content` -- a data chunk arrived (content, usage);
* :meth:`~AgentEvents.on_decision` -- the gateway posted its decision on
  the round's approval (before it feeds anything after that approval);
* :meth:`~AgentEvents.finish` -- the stream's terminal chunk (or its end)
  arrived.

Grammar, per round ``r``::

    calling(r) -> [approval(r)] -> file(r)* -> complete(r)

* rounds are numbered from 0, strictly increase, and each is below the
  forwarded ``max_tool_rounds``;
* content chunks only outside a round; the stream ends outside a round, and
  nothing agentic follows its end (a usage-only chunk may; ending twice --
  the terminal chunk, then ``[DONE]`` -- is one end);
* at most one approval per round, before its files;
* the tool is reported as run (files, or a ``complete`` with output) only
  after the gateway approved that round's approval. A denial -- the
  gateway's, or the worker's own (a timeout, a full channel) -- is reported
  by a ``complete`` in the worker's denial shape (``wire.is_denial``), which
  is valid; the same with output is the breach the spec names. A round the
  worker ran without asking cannot happen under ``--agent-permission ask``
  (the gateway never sends ``remember_for_session``), so it is a breach too;
* a ``complete`` names the round's tool; one for a round never seen
  ``calling`` is a violation;
* any other event name is a violation.

Files (``files.py``): each body is decoded and kept while the request's
kept files stay within ``files_max_count`` and ``files_max_bytes`` (decoded,
together); past either, or elided by the worker, or a placeholder, the file
is dropped and counted (:class:`FileProduced` with ``dropped``;
:attr:`AgentEvents.files_dropped`), and the run goes on. How large one event
may be is the framing's bound (:func:`line_bound`).

Errors: every breach is :func:`~gateway.core.sse.violation`
(``upstream_protocol_error``) with a fixed message; the machine then stays in
``ERROR`` and re-raises that error on every later call (one error sink).
Calling :meth:`~AgentEvents.on_decision` out of turn is the relay's bug,
a ``RuntimeError``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from gateway.apis.agents.files import FileProduced, bounded_file
from gateway.apis.agents.jsonspans import members
from gateway.apis.agents.wire import (
    ApprovalRequired,
    FileBody,
    ToolCalling,
    ToolComplete,
    read_approval,
    read_calling,
    read_complete,
    read_file,
    read_progress,
)
from gateway.core.errors import GatewayError
from gateway.core.sse import violation

__all__ = [
    "AGENT_EVENT_NAMES",
    "AgentEvent",
    "AgentEvents",
    "EventLimits",
    "FileProduced",
    "RoundState",
    "line_bound",
]

PROGRESS = "agentic_tool_call_progress"
APPROVAL = "agentic_tool_approval_required"
FILE = "file_produced"
#: the named events of an agentic chat stream (any other name is a violation)
AGENT_EVENT_NAMES: Final = frozenset((PROGRESS, APPROVAL, FILE))

T = TypeVar("T")


def line_bound(max_line_bytes: int, files_max_bytes: int) -> int:
    """The SSE line (and event) bound of an agentic request (spec §24): a
    ``file_produced`` event may carry ``files.max_bytes`` of base64 and its fields."""
    return max(max_line_bytes, files_max_bytes * 4 // 3 + 4096)


@dataclass(frozen=True, slots=True)
class EventLimits:
    """What one agentic stream may hold; built per request."""

    #: the forwarded (clamped) max_tool_rounds: every round index is below it
    max_tool_rounds: int
    files_max_bytes: int
    files_max_count: int
    #: arguments, code, queries: characters (approval arguments: UTF-8 bytes)
    max_argument_bytes: int = 262_144
    #: the worker's session id the gateway forwarded; approvals must name it
    session_id: str | None = None

    def __post_init__(self) -> None:
        if self.max_tool_rounds < 1 or self.files_max_bytes < 1 or self.max_argument_bytes < 1:
            raise ValueError("agentic stream bounds must be positive")
        if self.files_max_count < 0:
            raise ValueError("files_max_count must not be negative")


AgentEvent = ToolCalling | ApprovalRequired | FileProduced | ToolComplete


class RoundState(enum.Enum):
    OUTSIDE = "outside"  # between rounds: content may flow
    CALLING = "calling"  # the round's tool call was announced
    APPROVAL = "approval"  # the round's approval arrived
    FILES = "files"  # the round's tool produced a file
    FINISHED = "finished"  # the stream's end arrived outside a round
    ERROR = "error"


class AgentEvents:
    """The agentic events of one stream; see the module docstring."""

    def __init__(self, limits: EventLimits) -> None:
        self.limits = limits
        self.state = RoundState.OUTSIDE
        self.error: GatewayError | None = None
        #: the last round announced (-1: none yet)
        self.round = -1
        #: rounds completed
        self.rounds = 0
        self.files_kept = 0
        self.files_dropped = 0
        self.bytes_kept = 0
        self._calling: ToolCalling | None = None
        #: the gateway's decision on the open round: None (not asked), pending, approve, deny
        self._decision: Literal["pending", "approve", "deny"] | None = None

    # -- input -------------------------------------------------------------------

    def on_event(self, name: str, data: str) -> AgentEvent:
        """One named event of the worker's stream."""
        return self._guard(lambda: self._on_event(name, data))

    def on_content(self) -> None:
        """A data chunk (content, reasoning, usage) arrived."""

        def check() -> None:
            # After the end too: a usage-only chunk may follow the terminal one.
            if self.state not in (RoundState.OUTSIDE, RoundState.FINISHED):
                raise violation("Upstream sent content inside a tool round.")

        self._guard(check)

    def finish(self) -> None:
        """The stream's terminal chunk, or its end, arrived."""

        def check() -> None:
            if self.state is RoundState.FINISHED:
                return  # the terminal chunk, then [DONE] or EOF: one end
            if self.state is not RoundState.OUTSIDE:
                raise violation("Upstream ended its stream inside a tool round.")
            self.state = RoundState.FINISHED

        self._guard(check)

    def on_decision(self, round: int, approve: bool) -> None:
        """The gateway decided the approval of ``round`` (and posted it)."""
        if self.error is not None:
            raise self.error.with_traceback(None)
        if self.state is not RoundState.APPROVAL or round != self.round:
            raise RuntimeError("a decision for no pending approval")
        if self._decision != "pending":
            raise RuntimeError("the approval was already decided")
        self._decision = "approve" if approve else "deny"

    # -- transitions -------------------------------------------------------------

    def _guard(self, step: Callable[[], T]) -> T:
        if self.error is not None:
            raise self.error.with_traceback(None)
        try:
            return step()
        except GatewayError as exc:
            self.state = RoundState.ERROR
            self.error = exc
            raise

    def _on_event(self, name: str, data: str) -> AgentEvent:
        if name not in AGENT_EVENT_NAMES:
            raise violation("Upstream sent an unknown named event.")
        if self.state is RoundState.FINISHED:
            raise violation("Upstream sent an agentic event after its stream's end.")
        fields = members(data)
        if name == PROGRESS:
            progress = read_progress(fields)
            if progress.phase == "calling":
                return self._calling_event(read_calling(progress, self.limits.max_argument_bytes))
            if self.state is RoundState.OUTSIDE:
                raise violation("Upstream completed a tool round it never announced.")
            if progress.round != self.round:
                raise violation("Upstream completed another round than the open one.")
            assert self._calling is not None
            complete = read_complete(progress, self._calling, self._decision == "approve")
            self.state = RoundState.OUTSIDE
            self.rounds += 1
            self._calling = None
            self._decision = None
            return complete
        if name == APPROVAL:
            return self._approval_event(fields)
        return self._file_event(read_file(fields))

    def _calling_event(self, calling: ToolCalling) -> ToolCalling:
        if self.state is not RoundState.OUTSIDE:
            raise violation("Upstream announced a tool call inside a tool round.")
        if calling.round <= self.round:
            raise violation("Upstream's tool rounds do not strictly increase.")
        if calling.round >= self.limits.max_tool_rounds:
            raise violation("Upstream ran more tool rounds than the request allows.")
        self.state = RoundState.CALLING
        self.round = calling.round
        self._calling = calling
        self._decision = None
        return calling

    def _approval_event(self, fields: dict[str, tuple[Any, str]]) -> ApprovalRequired:
        if self.state is RoundState.OUTSIDE:
            raise violation("Upstream asked for an approval outside a tool round.")
        if self.state is not RoundState.CALLING:
            raise violation("Upstream asked for a second approval, or one after files.")
        assert self._calling is not None
        approval = read_approval(fields, self._calling, self.limits.max_argument_bytes)
        if approval.round != self.round:
            raise violation("Upstream asked for an approval of another round.")
        expected = self.limits.session_id
        if expected is not None and approval.session_id != expected:
            raise violation("Upstream asked for an approval in another session.")
        self.state = RoundState.APPROVAL
        self._decision = "pending"
        return approval

    def _file_event(self, body: FileBody) -> FileProduced:
        if self.state is RoundState.OUTSIDE:
            raise violation("Upstream sent a file outside a tool round.")
        if body.round != self.round:
            raise violation("Upstream sent a file of another round.")
        if self._decision != "approve":
            raise violation("Upstream sent a file of a tool the gateway did not approve.")
        self.state = RoundState.FILES
        room = self.limits.files_max_bytes - self.bytes_kept
        full = self.files_kept >= self.limits.files_max_count
        produced = bounded_file(body, room=room, full=full)
        if produced.data is None:
            self.files_dropped += 1
        else:
            self.files_kept += 1
            self.bytes_kept += len(produced.data)
        return produced
