"""What the simulator observed (shared with test threads) and how it routes
and answers each request (runs on the simulator's event loop only)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

import orjson

from gateway.testing.simulator.knobs import DirectiveError, SimKnobs, apply_directives
from gateway.testing.simulator.plans import (
    Ctx,
    Op,
    Step,
    json_reply,
    plan_inference,
    simple_reply,
    text_reply,
)

if TYPE_CHECKING:
    from gateway.testing.simulator.transport import Connection

_VISIBLE_ASCII = re.compile(r"[\x20-\x7e]+")


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
    does, so ``finished_at`` comes later).
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


class State:
    """Everything shared between the event-loop thread and test threads."""

    def __init__(self, model_id: str, knobs: SimKnobs, directives: bool) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.model_id = model_id
        self.knobs = self.initial_knobs = knobs
        self.directives = directives
        self.created = int(time.time())
        self.requests: list[SimRequest] = []
        self.next_seq = 1
        self.next_completion = 1
        self.active = 0
        self.max_active = 0
        self.model_status: str | None = "loaded"
        self.model_entries = 1
        self.models_fault: str | None = None

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


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _rough_tokens(texts: Iterable[str], per_text: int) -> int:
    """About four characters a token, plus a few for each message's template."""
    total = sum((len(t) + 3) // 4 + per_text for t in texts)
    return max(1, total)


def _is_json_type(headers: dict[str, str]) -> bool:
    mime = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


def _extract(req: Any, chat: bool) -> tuple[list[str], str, str | None]:
    """(all prompt texts, text that may hold directives, deserialization problem)."""
    if not isinstance(req, dict):
        return [], "", "invalid type: expected a JSON object"
    if not chat:
        prompt = req.get("prompt")
        if not isinstance(prompt, str):
            return [], "", "missing field `prompt`" if prompt is None else "invalid type: prompt"
        return [prompt], prompt, None
    messages = req.get("messages")
    if isinstance(messages, str):  # a bare string is one user message
        return [messages], messages, None
    if not isinstance(messages, list):
        return [], "", "missing field `messages`" if messages is None else "invalid type: messages"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return [], "", "invalid type: message"
    texts = [_text_of(m.get("content")) for m in messages]
    users = [t for m, t in zip(messages, texts, strict=True) if m["role"] == "user"]
    return texts, users[-1] if users else "", None


_DESERIALIZE = "Failed to deserialize the JSON body into the target type: "
_ADMIN_METHODS: dict[str, str] = {
    "/v1/models/status": "POST",
    "/v1/models/unload": "POST",
    "/v1/models/reload": "POST",
    "/v1/models/tune": "POST",
    "/v1/system/info": "GET",
    "/v1/system/doctor": "POST",
    "/v1/embeddings": "POST",
    "/v1/lora_adapters": "GET",
    "/metrics": "GET",
    "/re_isq": "POST",
    "/calibration/start": "POST",
    "/calibration/apply": "POST",
    "/calibration/status": "GET",
}


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
        self.state.record(req)
        rid = _request_id(headers)
        completed = False
        try:
            reply: Iterator[Step] | Ctx
            if inc.refusal is not None:
                reply = text_reply(*inc.refusal, rid)
            else:
                reply = self._route(inc.method, path, inc.body, headers, rid)
            if isinstance(reply, Ctx):
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

    async def _infer(self, conn: Connection, req: SimRequest, ctx: Ctx, keep: bool) -> bool:
        # The id counter advances only for admitted inference, like the engine's.
        ctx = dataclasses.replace(ctx, number=self.state.enter())
        conn.begin(req, cancel_on_lost=ctx.stream)
        try:
            return await conn.play(plan_inference(ctx), ctx.knobs, keep)
        finally:
            conn.end()
            self.state.leave()

    def _route(
        self, method: str, path: str, body: bytes, headers: dict[str, str], rid: str
    ) -> Iterator[Step] | Ctx:
        if path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                return simple_reply(405, b"", rid)
            return self._inference(path == "/v1/chat/completions", body, headers, rid)
        if path in ("/v1/models", "/health", "/"):
            if method != "GET":
                return simple_reply(405, b"", rid)
            return self._models(rid) if path == "/v1/models" else text_reply(200, "OK", rid)
        allowed = _ADMIN_METHODS.get(path)
        if allowed is None:
            return simple_reply(404, b"", rid)
        if method != allowed:
            return simple_reply(405, b"", rid)
        return self._admin(path, body, rid)

    def _models(self, rid: str) -> Iterator[Step]:
        st = self.state
        with st.cond:
            status, entries, fault = st.model_status, st.model_entries, st.models_fault
        if fault == "hang":
            return iter([Op.HANG])
        if fault == "bad_body":
            return simple_reply(200, b'{"object":"list","data":[{"id":', rid, "application/json")
        data: list[dict[str, Any]] = [
            {
                "id": "default",
                "object": "model",
                "created": st.created,
                "owned_by": "local",
                "root": "default",
            }
        ]
        for _ in range(entries if status is not None else 0):
            data.append(
                {
                    "id": st.model_id,
                    "object": "model",
                    "created": st.created,
                    "owned_by": "local",
                    "root": st.model_id,
                    "status": status,
                }
            )
        return json_reply(200, {"object": "list", "data": data}, rid)

    def _admin(self, path: str, body: bytes, rid: str) -> Iterator[Step]:
        st = self.state
        if path == "/metrics":
            with st.cond:
                active = st.active
            text = f"# mistralrs protocol simulator\nmistralrs_sequences_running {active}\n"
            return text_reply(200, text, rid)
        if path == "/v1/lora_adapters":
            error = {"message": "LoRA runtime is not available", "type": "invalid_request_error"}
            return json_reply(409, {"error": {**error, "code": "lora_runtime_unavailable"}}, rid)
        if path in ("/re_isq", "/calibration/start", "/calibration/apply"):
            # These handlers answer in text/plain, errors included (reference §5).
            return text_reply(200, f"simulated: {path} accepted", rid)
        if path not in ("/v1/models/status", "/v1/models/unload", "/v1/models/reload"):
            return json_reply(200, {"simulator": True, "route": path}, rid)
        try:
            parsed = orjson.loads(body)
        except ValueError:
            return text_reply(400, _DESERIALIZE + "expected value at line 1 column 1", rid)
        model_id = parsed.get("model_id") if isinstance(parsed, dict) else None
        if not isinstance(model_id, str):
            return text_reply(422, _DESERIALIZE + "missing field `model_id`", rid)
        with st.cond:
            if st.model_status is None or model_id not in (st.model_id, "default"):
                status = "not_found"
            else:
                if path == "/v1/models/unload":
                    st.model_status = "unloaded"
                elif path == "/v1/models/reload":
                    st.model_status = "loaded"
                status = st.model_status
        return json_reply(200, {"model_id": model_id, "status": status}, rid)

    def _inference(
        self, chat: bool, body: bytes, headers: dict[str, str], rid: str
    ) -> Iterator[Step] | Ctx:
        # Checks in the real server's order (the body limit is the connection's:
        # transport.py refuses a larger body while it arrives): content type,
        # JSON syntax, JSON shape (axum), then the handler's own parsing.
        if not _is_json_type(headers):
            return text_reply(415, "Expected request with `Content-Type: application/json`", rid)
        try:
            req = orjson.loads(body)
        except ValueError:
            return text_reply(400, _DESERIALIZE + "expected value at line 1 column 1", rid)
        texts, directive_text, problem = _extract(req, chat)
        model = req.get("model", "default") if problem is None else None
        stream = req.get("stream", False) if problem is None else None
        max_tokens = (
            req.get("max_tokens", req.get("max_completion_tokens")) if problem is None else None
        )
        if problem is None and not (isinstance(model, str) and isinstance(stream, bool)):
            problem = "invalid type: model or stream"
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0
        ):
            problem = "invalid type: max_tokens"
        if problem is not None:
            return text_reply(422, _DESERIALIZE + problem, rid)
        assert isinstance(model, str) and isinstance(stream, bool)
        st = self.state
        with st.cond:
            present = st.model_status is not None
            available = present and model in (st.model_id, "default")
            if available and st.model_status == "unloaded":
                st.model_status = "loaded"  # mistral.rs reloads on demand inside the request
            knobs, use_directives = st.knobs, st.directives
        if not available:
            names = st.model_id if present else ""
            message = (
                f"Requested model '{model}' is not available. Available models: {names}. "
                "Use 'default' to use the default model."
            )
            return json_reply(500, {"message": message}, rid)
        if max_tokens == 0:
            return json_reply(500, {"message": "`max_tokens` must be at least 1"}, rid)
        if use_directives:
            try:
                knobs = apply_directives(directive_text, knobs)
            except DirectiveError as exc:
                return text_reply(400, str(exc), rid)
        prompt_tokens = _rough_tokens(texts, 4 if chat else 0)
        return Ctx(chat, stream, knobs, 0, st.created, st.model_id, max_tokens, prompt_tokens, rid)
