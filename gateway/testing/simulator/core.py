"""How the simulator routes and answers each request (runs on the simulator's
event loop only).

``Core`` records a request in the shared :class:`~state.State`, asks
``handlers`` for its reply (a finished plan, or a :class:`~handlers.Job` for
inference, which gets the next completion number when admitted) and plays it
on the connection, which it knows only as a :class:`~channel.Channel`.
Plans are pure; the ``StoreCommit`` notes a Responses plan yields are taken
out here and applied to the store at the point of the reply they mark, and an
agentic plan's notes go to an ``agent_core.AgentDriver`` (its approval waits
come back as ``Wait`` steps the connection awaits).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import orjson

from gateway.testing.simulator.agent_core import AgentDriver
from gateway.testing.simulator.agent_notes import AGENT_NOTES
from gateway.testing.simulator.channel import Channel, Incoming
from gateway.testing.simulator.handlers import route
from gateway.testing.simulator.handling import Job
from gateway.testing.simulator.plans import PlanStep, Step, StoreCommit, text_reply
from gateway.testing.simulator.state import SimRequest, State

_VISIBLE_ASCII = re.compile(r"[\x20-\x7e]+")
_MODEL_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/images/generations",
        "/v1/audio/speech",
    }
)


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
        self.connections: set[Channel] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._date = (0, "")

    def date(self) -> str:
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]

    async def respond(self, conn: Channel, inc: Incoming) -> bool:
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
            reply: Iterator[Step] | Job
            if inc.refusal is not None:
                reply = text_reply(*inc.refusal, rid)
            else:
                reply = route(self.state, inc.method, path, inc.body, headers, rid)
            if isinstance(reply, Job):
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

    async def _infer(self, conn: Channel, req: SimRequest, job: Job, keep: bool) -> bool:
        # The id counter advances only for admitted inference, like the engine's.
        number = self.state.enter(job.numbers)
        conn.begin(req, cancel_on_lost=job.stream)
        try:
            plan = self._committing(job.build(number), req)
            return await conn.play(plan, job.knobs, keep)
        finally:
            conn.end()
            self.state.leave(req)

    def _committing(self, plan: Iterator[PlanStep], req: SimRequest) -> Iterator[Step]:
        """The plan's steps, its notes taken out and acted on where they stand."""
        driver: AgentDriver | None = None
        for step in plan:
            if isinstance(step, StoreCommit):
                self.state.commit(step)
            elif isinstance(step, AGENT_NOTES):
                driver = driver or AgentDriver(self.state, req)
                wait = driver.apply(step)
                if wait is not None:
                    yield wait
            else:
                yield step
