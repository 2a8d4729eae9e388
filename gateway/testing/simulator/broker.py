"""The simulated worker's approval broker, agentic session store and the records
tests read. Pure data: ``State`` holds them under its lock and passes ``now``
(monotonic seconds) in.

Broker (the worker's ``approvals.rs``), keyed only by approval id:

* ``announce(id)``: the approval event is about to go out; a decision posted
  from now on, before the wait begins, is kept (``queued``).
* ``begin_wait(id, wake)``: a kept decision is returned at once; otherwise the
  wait is pending, and ``resolve`` hands its decision to ``wake`` (the core's
  future: called by the handler on the event loop, after the lock is
  released) and answers ``resolved``. An id neither announced nor pending is
  ``not_found``. ``drop(id)`` ends a wait (decided, timed out, or its client
  gone: then a later decision is ``not_found``).
* ``remember(session)``: an approval with ``remember_for_session`` approves
  every later action of that session without asking. The worker keeps two
  such lists (the broker's, never evicted, and the engine's, 30 minutes);
  here one, with the session TTL, at most ``MAX_SESSIONS``.
* Every posted decision is recorded (``ApprovalRecord``), the last
  ``MAX_RECORDS``; announced and queued ids at most ``MAX_IDS`` each.

Session store (``agentic_session.rs``): at most ``MAX_SESSIONS`` (128), idle
``ttl_s`` (1800 s, a constructor argument of the simulator), least recently
used evicted first. A run without ``session_id`` whose request has at least
two messages takes over a stored session whose messages are a prefix of the
request's (``find``): that is how the worker splices sessions across callers.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.testing.simulator.agent_notes import Decision

MAX_SESSIONS = 128
SESSION_TTL_S = 30 * 60.0
MAX_RECORDS = 10_000
MAX_IDS = 4096

Messages = tuple[tuple[str, str], ...]  # (role, text) of each message


@dataclass(slots=True)
class ApprovalRecord:
    """One ``POST /v1/agent/approvals/{id}`` as received; ``status`` is what it answered."""

    approval_id: str
    decision: str  # approve | deny
    remember_for_session: bool
    message: str | None
    status: str  # resolved | queued | not_found
    received_at: float


@dataclass(slots=True)
class RoundRecord:
    round: int
    tool_name: str
    kind: str
    approval_id: str | None
    outcome: str  # auto | approved | denied | policy | timeout | remembered
    message: str | None


@dataclass(slots=True)
class AgentRun:
    """One agentic chat request as the simulated worker ran it.

    ``requested_session_id`` is what the request carried (None: none);
    ``session_id`` the one the run used (echoed, spliced, or fresh).
    ``approvals`` lists the approval ids announced, in order;
    ``abandoned_approval`` is the id that was pending when the client went
    away (its wait was dropped).
    """

    request_seq: int
    session_id: str
    requested_session_id: str | None
    permission: str
    max_tool_rounds: int
    plan: tuple[str, ...]
    rounds: list[RoundRecord] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    abandoned_approval: str | None = None


class ApprovalBroker:
    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.announced: OrderedDict[str, None] = OrderedDict()
        self.early: OrderedDict[str, Decision] = OrderedDict()
        self.pending: dict[str, Callable[[Decision], None]] = {}
        self.remembered: dict[str, float] = {}
        self.records: deque[ApprovalRecord] = deque(maxlen=MAX_RECORDS)

    def clear(self) -> None:
        """Forget the records and remembered sessions (waits in progress stay)."""
        self.records.clear()
        self.remembered.clear()

    def announce(self, approval_id: str) -> None:
        self.announced[approval_id] = None
        while len(self.announced) > MAX_IDS:
            self.announced.popitem(last=False)

    def begin_wait(self, approval_id: str, wake: Callable[[Decision], None]) -> Decision | None:
        early = self.early.pop(approval_id, None)
        if early is not None:
            return early
        self.pending[approval_id] = wake
        return None

    def resolve(
        self, approval_id: str, decision: Decision, record: ApprovalRecord
    ) -> Callable[[Decision], None] | None:
        """Take a posted decision; sets ``record.status``; the waiter to wake, if any."""
        self.records.append(record)
        wake = self.pending.pop(approval_id, None)
        if wake is not None:
            self.announced.pop(approval_id, None)
            record.status = "resolved"
            return wake
        if approval_id in self.announced:
            del self.announced[approval_id]
            self.early[approval_id] = Decision(
                decision.approve, decision.remember_for_session, decision.message, "early"
            )
            while len(self.early) > MAX_IDS:
                self.early.popitem(last=False)
            record.status = "queued"
        else:
            record.status = "not_found"
        return None

    def drop(self, approval_id: str) -> None:
        self.pending.pop(approval_id, None)
        self.announced.pop(approval_id, None)

    def is_remembered(self, session_id: str, now: float) -> bool:
        self._evict(now)
        if session_id not in self.remembered:
            return False
        self.remembered[session_id] = now
        return True

    def remember(self, session_id: str, now: float) -> None:
        self._evict(now)
        self.remembered[session_id] = now
        while len(self.remembered) > MAX_SESSIONS:
            del self.remembered[min(self.remembered, key=self.remembered.__getitem__)]

    def _evict(self, now: float) -> None:
        stale = [s for s, at in self.remembered.items() if now - at >= self.ttl_s]
        for session_id in stale:
            del self.remembered[session_id]


@dataclass(slots=True)
class _Session:
    messages: Messages
    last_used: float


class SessionStore:
    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.sessions: dict[str, _Session] = {}

    def clear(self) -> None:
        self.sessions.clear()

    def ids(self, now: float) -> list[str]:
        self._evict(now)
        return list(self.sessions)

    def messages(self, session_id: str, now: float) -> Messages | None:
        self._evict(now)
        entry = self.sessions.get(session_id)
        return None if entry is None else entry.messages

    def find(self, incoming: Messages, now: float) -> str | None:
        """The stored session whose messages are a prefix of ``incoming`` (≥ 2 of them)."""
        self._evict(now)
        if len(incoming) < 2:
            return None
        for session_id, entry in self.sessions.items():
            stored = entry.messages
            if stored and len(stored) <= len(incoming) and incoming[: len(stored)] == stored:
                entry.last_used = now
                return session_id
        return None

    def save(self, session_id: str, messages: Messages, now: float) -> None:
        self._evict(now)
        if session_id not in self.sessions:
            while len(self.sessions) >= MAX_SESSIONS:
                oldest = min(self.sessions, key=lambda s: self.sessions[s].last_used)
                del self.sessions[oldest]
        self.sessions[session_id] = _Session(messages, now)

    def _evict(self, now: float) -> None:
        stale = [s for s, e in self.sessions.items() if now - e.last_used >= self.ttl_s]
        for session_id in stale:
            del self.sessions[session_id]
