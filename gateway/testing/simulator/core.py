"""What the simulator observed (shared with test threads) and how it routes
and answers each request (runs on the simulator's event loop only).

``State`` holds everything a test thread may read or change (recorded
requests, counters, the routes and their statuses, the Responses store, the
knobs) behind one lock. ``Core`` records a request, asks ``handlers`` for its
reply (a finished plan, or a :class:`~handlers.Job` for inference, which gets
the next completion number when admitted) and plays it on the connection.
Plans are pure; the ``StoreCommit`` notes a Responses plan yields are taken
out here and applied to the store at the point of the reply they mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

import orjson

from gateway.testing.simulator import handlers
from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import PlanStep, Step, StoreCommit, text_reply
from gateway.testing.simulator.routes import Routes
from gateway.testing.simulator.store import ResponseStore

if TYPE_CHECKING:
    from gateway.testing.simulator.transport import Connection

_VISIBLE_ASCII = re.compile(r"[\x20-\x7e]+")
_MODEL_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"}
)


# ------------------------------------------------------------- observations


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
    inference, Responses or embeddings request named (``"default"`` when it
    named none, as the real server reads it; None for other requests or a body
    that is not a JSON object with a string ``model``).
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
        self, model_ids: Sequence[str], knobs: SimKnobs, directives: bool, id_seed: int
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
        self.store = ResponseStore.empty()

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

    def enter(self) -> int:
        with self.cond:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            number = self.next_completion
            self.next_completion += 1
            self.cond.notify_all()
            return number

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def commit(self, commit: StoreCommit) -> None:
        with self.cond:
            self.store.commit(commit.response_id, commit.history, commit.resource)
            self.cond.notify_all()


# ---------------------------------------------------------------- requests


@dataclass(slots=True)
class Incoming:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool
    refusal: tuple[int, str] | None = None


def _request_id(headers: dict[str, str]) -> str:
    value = headers.get("x-request-id", "")
    if value.strip() and _VISIBLE_ASCII.fullmatch(value):
        return value
    return "req_" + uuid.uuid4().hex


def _named_model(path: str, parsed: Any) -> str | None:
    if path not in _MODEL_PATHS or not isinstance(parsed, dict):
        return None
    model = parsed.get("model", "default")
    return model if isinstance(model, str) else None


class Core:
    """Routing and per-request logic; runs on the simulator's event loop only."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._date = (0, "")

    def date(self) -> str:
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]

    async def respond(self, conn: Connection, inc: Incoming) -> bool:
        """Record, route and play one request; True if the connection may be reused."""
        path, _, query = inc.target.partition("?")
        headers: dict[str, str] = {}
        for name, value in inc.headers:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        parsed: Any | None = None
        with contextlib.suppress(ValueError):
            parsed = orjson.loads(inc.body) if inc.body else None
        req = SimRequest(0, inc.method, path, headers, inc.body, parsed, time.monotonic())
        req.query = query
        req.model = _named_model(path, parsed)
        self.state.record(req)
        rid = _request_id(headers)
        completed = False
        try:
            reply: Iterator[Step] | handlers.Job
            if inc.refusal is not None:
                reply = text_reply(*inc.refusal, rid)
            else:
                reply = handlers.route(self.state, inc.method, path, inc.body, headers, rid)
            if isinstance(reply, handlers.Job):
                keep = await self._infer(conn, req, reply, inc.keep_alive)
            else:
                conn.begin(req, cancel_on_lost=True)
                try:
                    keep = await conn.play(reply, None, inc.keep_alive)
                finally:
                    conn.end()
            completed = True
            return keep and inc.refusal is None
        finally:
            # A client that left (a non-streamed request keeps running after that,
            # like the engine) did not get the response, whatever the script did.
            completed = completed and req.disconnected_at is None
            self.state.update(req, finished_at=time.monotonic(), completed=completed)

    async def _infer(
        self, conn: Connection, req: SimRequest, job: handlers.Job, keep: bool
    ) -> bool:
        # The id counter advances only for admitted inference, like the engine's.
        number = self.state.enter()
        conn.begin(req, cancel_on_lost=job.stream)
        try:
            plan = self._committing(job.build(number))
            return await conn.play(plan, job.knobs, keep)
        finally:
            conn.end()
            self.state.leave()

    def _committing(self, plan: Iterator[PlanStep]) -> Iterator[Step]:
        for step in plan:
            if isinstance(step, StoreCommit):
                self.state.commit(step)
            else:
                yield step
