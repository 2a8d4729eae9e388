"""What an agentic plan (agents.py) tells or asks the core, between the bytes it
yields. Pure data; never written to the wire.

A plan stays a pure generator of steps, but an agentic run depends on things
only the core knows: whether the session's actions were already approved
(``remember_for_session``), and the caller's decision on an approval. The plan
yields a question (``Announce``, ``AwaitDecision``); the core answers it by
filling in its answer field before the plan's next step is taken (the plan is
pulled one step at a time, so the answer is there when the generator
resumes). ``RunStart``, ``RoundDone`` and ``SaveSession`` only report, so
tests can read what happened (``state.State.agent_runs``, the session store).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one approval: ``by`` caller | early (posted before the wait
    began) | timeout | remembered (the session's actions were approved before)."""

    approve: bool
    remember_for_session: bool = False
    message: str | None = None
    by: str = "caller"


@dataclass(slots=True)
class RunStart:
    """An agentic run begins (the first step of its plan)."""

    session_id: str
    requested_session_id: str | None
    permission: str
    max_tool_rounds: int
    plan: tuple[str, ...]


@dataclass(slots=True)
class Announce:
    """Question, before an approval event: was the session's every action approved?
    The core sets ``remembered``; if False it has noted the id as announced, so a
    decision posted before the wait begins is queued."""

    approval_id: str
    session_id: str
    remembered: bool = False


@dataclass(slots=True)
class AwaitDecision:
    """Question: the decision on ``approval_id``. The core waits (keep-alives go on)
    at most ``timeout_s``, then answers a denial "Approval timed out."."""

    approval_id: str
    session_id: str
    timeout_s: float
    decision: Decision | None = None


@dataclass(slots=True)
class RoundDone:
    """A round's tool call was decided (approved, or denied and why)."""

    round: int
    tool_name: str
    kind: str
    approval_id: str | None
    outcome: str  # auto | approved | denied | policy | timeout | remembered
    message: str | None = None


@dataclass(slots=True)
class SaveSession:
    """The run's conversation, as the worker saves it under the session id."""

    session_id: str
    messages: tuple[tuple[str, str], ...] = field(default_factory=tuple)


AgentNote = RunStart | Announce | AwaitDecision | RoundDone | SaveSession
AGENT_NOTES = (RunStart, Announce, AwaitDecision, RoundDone, SaveSession)
