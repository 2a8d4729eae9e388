"""What the simulator observed, shared with test threads.

``State`` holds everything a test thread may read or change (recorded
requests, counters, the routes and their statuses, the Responses store, the
knobs, the approval broker, the agentic sessions and runs) behind one lock;
``SimRequest`` is one recorded request. Both sit below the request path
(handlers.py reads and changes ``State``, core.py records into it, server.py
exposes it), so they import nothing above it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.broker import (
    MAX_RECORDS,
    SESSION_TTL_S,
    AgentRun,
    ApprovalBroker,
    SessionStore,
)
from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.metrics import EngineMetrics
from gateway.testing.simulator.plans import StoreCommit
from gateway.testing.simulator.routes import Routes
from gateway.testing.simulator.store import ResponseStore


@dataclass
class SimRequest:
    """One request as the simulator received it.

    ``headers`` has lower-cased names; repeated headers are joined with ``", "``.
    ``completed`` means the simulator played its whole scripted response (a
    fault's script included) to a connected client; it stays False when the
    client went away first or the simulator stopped. ``disconnected_at`` is set
    when the client went away while its response was still being played (for a
    non-streamed request the script then runs on, as the engine's generation
    does, so ``finished_at`` comes later). ``model`` is the ``model`` an
    inference, Responses, Anthropic Messages or embeddings request named
    (``"default"`` when it named none, as the real server reads it; None for
    other requests or a body that is not a JSON object with a string
    ``model``).
    """

    seq: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any | None
    received_at: float
    finished_at: float | None = None
    disconnected_at: float | None = None
    completed: bool = False
    query: str = ""
    #: response bytes handed to the kernel so far (read live: backpressure tests)
    bytes_sent: int = 0
    model: str | None = None


class State:
    """Everything shared between the event-loop thread and test threads."""

    def __init__(
        self,
        model_ids: Sequence[str | tuple[str, str]],
        knobs: SimKnobs,
        directives: bool,
        id_seed: int,
        session_ttl_s: float = SESSION_TTL_S,
    ) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.routes = Routes(model_ids)
        self.knobs = self.initial_knobs = knobs
        self.directives = directives
        self.id_seed = id_seed
        self.created = int(time.time())
        self.requests: list[SimRequest] = []
        self.next_seq = 1
        self.next_completion = 1
        self.active = 0
        self.max_active = 0
        self.models_fault: str | None = None
        self.engine = EngineMetrics()
        self.store = ResponseStore.empty()
        self.approvals = ApprovalBroker(session_ttl_s)
        self.sessions = SessionStore(session_ttl_s)
        self.agent_runs: deque[AgentRun] = deque(maxlen=MAX_RECORDS)

    @property
    def model_id(self) -> str:
        return self.routes.default

    def record(self, req: SimRequest) -> None:
        with self.cond:
            req.seq = self.next_seq
            self.next_seq += 1
            self.requests.append(req)
            self.cond.notify_all()

    def update(self, req: SimRequest, **changes: Any) -> None:
        with self.cond:
            for name, value in changes.items():
                setattr(req, name, value)
            self.cond.notify_all()

    def take_number(self) -> int:
        """The next completion number (the engine's request counter)."""
        with self.cond:
            number = self.next_completion
            self.next_completion += 1
            return number

    def enter(self, numbers: int = 1) -> int:
        """Admit one inference request taking ``numbers`` engine request numbers;
        the first of them."""
        with self.cond:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            number = self.next_completion
            self.next_completion += numbers
            self.cond.notify_all()
            return number

    def leave(self, req: SimRequest | None = None) -> None:
        with self.cond:
            self.active -= 1
            if req is not None and req.disconnected_at is not None:
                # Like the engine: a canceled sequence ends only when it notices.
                self.engine.canceled(time.monotonic())
            self.cond.notify_all()

    def commit(self, commit: StoreCommit) -> None:
        with self.cond:
            self.store.commit(commit.response_id, commit.history, commit.resource)
            self.cond.notify_all()
