"""How the core answers an agentic plan's notes (agent_notes.py). Runs on the
simulator's event loop only.

One :class:`AgentDriver` per played plan. It records the run
(``State.agent_runs``), answers ``Announce`` from the broker, turns
``AwaitDecision`` into a :class:`~plans.Wait` the connection awaits (sending
keep-alives meanwhile), and saves the session at the end. The wait is an
``asyncio`` future registered with the broker; the approval handler resolves
it on this same loop. A wait ends with the decision, with the timeout
(denied "Approval timed out."), or with the client going away (the
connection cancels the reply: the wait is dropped and the run records the
abandoned approval id).
"""

from __future__ import annotations

import asyncio
import time

from gateway.testing.simulator.agent_notes import (
    AgentNote,
    Announce,
    AwaitDecision,
    Decision,
    RoundDone,
    RunStart,
    SaveSession,
)
from gateway.testing.simulator.broker import AgentRun, RoundRecord
from gateway.testing.simulator.plans import Wait
from gateway.testing.simulator.state import SimRequest, State

TIMED_OUT = "Approval timed out."


class AgentDriver:
    def __init__(self, state: State, req: SimRequest) -> None:
        self.state = state
        self.req = req
        self.run: AgentRun | None = None

    def apply(self, note: AgentNote) -> Wait | None:
        """Act on one note; a ``Wait`` for the connection to await, or None."""
        if isinstance(note, AwaitDecision):
            return Wait(lambda: self._decide(note))
        st = self.state
        now = time.monotonic()
        with st.cond:
            if isinstance(note, RunStart):
                self.run = AgentRun(
                    self.req.seq,
                    note.session_id,
                    note.requested_session_id,
                    note.permission,
                    note.max_tool_rounds,
                    note.plan,
                )
                st.agent_runs.append(self.run)
            elif isinstance(note, Announce):
                note.remembered = st.approvals.is_remembered(note.session_id, now)
                if not note.remembered:
                    st.approvals.announce(note.approval_id)
                    if self.run is not None:
                        self.run.approvals.append(note.approval_id)
            elif isinstance(note, RoundDone):
                if self.run is not None:
                    record = RoundRecord(
                        note.round,
                        note.tool_name,
                        note.kind,
                        note.approval_id,
                        note.outcome,
                        note.message,
                    )
                    self.run.rounds.append(record)
            elif isinstance(note, SaveSession):
                st.sessions.save(note.session_id, note.messages, now)
            st.cond.notify_all()
        return None

    async def _decide(self, note: AwaitDecision) -> None:
        st = self.state
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()

        def wake(decision: Decision) -> None:
            if not future.done():
                future.set_result(decision)

        with st.cond:
            early = st.approvals.begin_wait(note.approval_id, wake)
            st.cond.notify_all()
        try:
            if early is not None:
                decision = early
            else:
                try:
                    decision = await asyncio.wait_for(future, note.timeout_s)
                except TimeoutError:
                    decision = Decision(False, False, TIMED_OUT, "timeout")
        except asyncio.CancelledError:
            with st.cond:
                if self.run is not None:
                    self.run.abandoned_approval = note.approval_id
            raise
        finally:
            with st.cond:
                st.approvals.drop(note.approval_id)
                st.cond.notify_all()
        if decision.approve and decision.remember_for_session:
            with st.cond:
                st.approvals.remember(note.session_id, time.monotonic())
        note.decision = decision
