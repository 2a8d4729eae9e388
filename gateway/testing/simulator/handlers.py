"""One handler per route: request bytes (and the shared ``State``) in, a reply
out: a finished plan, or a :class:`Job` for inference. Runs on the event loop.

Checks follow the real server's order: the body limit (the connection's:
transport.py refuses a larger body while it arrives), content type (415),
JSON syntax (400), JSON shape (axum's 422 text), then the handler's own
checks (``{"message": ...}``), then the ``[[sim ...]]`` directives (400
``simulator: ...``). A request's ``model`` resolves through ``routes.Routes``;
an unknown one is 500 on chat, completions and Responses and 422 on
embeddings, as in the real server. The Anthropic routes (``/v1/messages``,
``/v1/messages/count_tokens``) refuse everything with the worker's Anthropic
error body, 400 ``invalid_request_error`` (an unknown model included).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import orjson

from gateway.testing.simulator.agent_handlers import APPROVALS, agentic_job, approval, messages_of
from gateway.testing.simulator.agent_input import parse_agentic
from gateway.testing.simulator.chat import Ctx, plan_inference
from gateway.testing.simulator.embeddings import check, parse_embeddings, plan_embeddings
from gateway.testing.simulator.handling import NOT_JSON, Job, Reply, read_json, request_knobs
from gateway.testing.simulator.knobs import (
    AGENTIC_CHAT_FAULTS,
    COUNT_TOKENS_FAULTS,
    EMBEDDINGS_FAULTS,
    FAULTS,
    MESSAGES_FAULTS,
    RESPONSES_FAULTS,
)
from gateway.testing.simulator.media_handlers import IMAGES, SPEECH, images, speech
from gateway.testing.simulator.messages import Turn, plan_count, plan_message, refusal
from gateway.testing.simulator.messages_input import parse_messages
from gateway.testing.simulator.metrics import reply as metrics_reply
from gateway.testing.simulator.plans import (
    Op,
    Reject,
    Step,
    json_reply,
    rough_tokens,
    simple_reply,
    sse_error_reply,
    text_reply,
)
from gateway.testing.simulator.responses import Run, background, plan_response
from gateway.testing.simulator.responses_input import parse_create
from gateway.testing.simulator.routes import INCOMPATIBLE
from gateway.testing.simulator.state import State

__all__ = ["Job", "Reply", "route"]  # Job and Reply live in handling.py; kept here for callers

_RESPONSES = "/v1/responses"
_MESSAGES = "/v1/messages"
_COUNT_TOKENS = "/v1/messages/count_tokens"
_ADMIN_METHODS: dict[str, str] = {
    "/v1/models/status": "POST",
    "/v1/models/unload": "POST",
    "/v1/models/reload": "POST",
    "/v1/models/tune": "POST",
    "/v1/system/info": "GET",
    "/v1/system/doctor": "POST",
    "/v1/lora_adapters": "GET",
    "/metrics": "GET",
    "/re_isq": "POST",
    "/calibration/start": "POST",
    "/calibration/apply": "POST",
    "/calibration/status": "GET",
}


def route(
    state: State, method: str, path: str, body: bytes, headers: dict[str, str], rid: str
) -> Reply:
    if path in ("/v1/chat/completions", "/v1/completions"):
        if method != "POST":
            return simple_reply(405, b"", rid)
        return _inference(state, path, body, headers, rid)
    if path in (_RESPONSES, "/v1/embeddings"):
        if method != "POST":
            return simple_reply(405, b"", rid)
        handler = _create_response if path == _RESPONSES else _embeddings
        return handler(state, body, headers, rid)
    if path in (_MESSAGES, _COUNT_TOKENS):
        if method != "POST":
            return simple_reply(405, b"", rid)
        return _messages(state, path, body, headers, rid)
    if path.startswith(APPROVALS):
        return approval(state, method, path, body, headers, rid)
    if path in (IMAGES, SPEECH):
        if method != "POST":
            return simple_reply(405, b"", rid)
        return (images if path == IMAGES else speech)(state, body, headers, rid)
    if path.startswith(_RESPONSES + "/"):
        return _stored_response(state, method, path[len(_RESPONSES) + 1 :], rid)
    if path in ("/v1/models", "/health", "/"):
        if method != "GET":
            return simple_reply(405, b"", rid)
        return _models(state, rid) if path == "/v1/models" else text_reply(200, "OK", rid)
    allowed = _ADMIN_METHODS.get(path)
    if allowed is None:
        return simple_reply(404, b"", rid)
    if method != allowed:
        return simple_reply(405, b"", rid)
    return _admin(state, path, body, rid)


# ------------------------------------------------------------------ helpers


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _extract(req: Any, chat: bool) -> tuple[list[str], str]:
    """(all prompt texts, text that may hold directives); Reject on a bad shape."""
    if not isinstance(req, dict):
        raise Reject.shape("invalid type: expected a JSON object")
    if not chat:
        prompt = req.get("prompt")
        if not isinstance(prompt, str):
            raise Reject.shape(
                "missing field `prompt`" if prompt is None else "invalid type: prompt"
            )
        return [prompt], prompt
    messages = req.get("messages")
    if isinstance(messages, str):  # a bare string is one user message
        return [messages], messages
    if not isinstance(messages, list):
        raise Reject.shape(
            "missing field `messages`" if messages is None else "invalid type: messages"
        )
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise Reject.shape("invalid type: message")
    texts = [_text_of(m.get("content")) for m in messages]
    users = [t for m, t in zip(messages, texts, strict=True) if m["role"] == "user"]
    return texts, users[-1] if users else ""


# ---------------------------------------------------- chat and completions


def _inference(state: State, path: str, body: bytes, headers: dict[str, str], rid: str) -> Reply:
    try:
        return _inference_job(state, path, body, headers, rid)
    except Reject as reject:
        return reject.reply(rid)


def _inference_job(
    state: State, path: str, body: bytes, headers: dict[str, str], rid: str
) -> Reply:
    chat = path == "/v1/chat/completions"
    req = read_json(body, headers)
    texts, directive_text = _extract(req, chat)
    model = req.get("model", "default")
    stream = req.get("stream", False)
    max_tokens = req.get("max_tokens", req.get("max_completion_tokens"))
    problem = None
    if not (isinstance(model, str) and isinstance(stream, bool)):
        problem = "invalid type: model or stream"
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0
    ):
        problem = "invalid type: max_tokens"
    if problem is not None:
        raise Reject.shape(problem)
    agent = parse_agentic(req, messages_of(req)) if chat else None
    with state.cond:
        found = state.routes.resolve(model)
        message = state.routes.unknown_model_message(model)
        created = state.created
    if found is None:
        raise Reject.handler(500, message)
    if max_tokens == 0:
        raise Reject.handler(500, "`max_tokens` must be at least 1")
    if not found.serves("chat"):
        # the engine's category check, after the stream (if any) has begun
        if stream:
            return sse_error_reply(rid, INCOMPATIBLE)
        raise Reject.handler(422, INCOMPATIBLE)
    faults = FAULTS if agent is None else AGENTIC_CHAT_FAULTS
    knobs = request_knobs(state, directive_text, faults, path, agentic=agent is not None)
    prompt_tokens = rough_tokens(texts, 4 if chat else 0)
    ctx = Ctx(chat, stream, knobs, 0, created, found.model_id, max_tokens, prompt_tokens, rid)
    if agent is not None:
        return agentic_job(state, ctx, agent)
    return Job(stream, knobs, lambda n: plan_inference(dataclasses.replace(ctx, number=n)))


# -------------------------------------------------------------- responses


def _create_response(state: State, body: bytes, headers: dict[str, str], rid: str) -> Reply:
    try:
        req = read_json(body, headers)
        call = parse_create(req)
        now = time.monotonic()
        with state.cond:
            found = state.routes.resolve(call.model)
            message = state.routes.unknown_model_message(call.model)
            previous = call.previous_response_id
            history = state.store.history(previous, now) if previous is not None else None
            seed, created = state.id_seed, state.created
        if found is None:
            raise Reject.handler(500, message)
        if not found.serves("chat"):
            raise Reject.handler(422, INCOMPATIBLE)
        knobs = request_knobs(state, call.directive_text, RESPONSES_FAULTS, _RESPONSES)
    except Reject as reject:
        return reject.reply(rid)
    sent = (*(history or ()), *call.texts)
    run = Run(call, knobs, 0, seed, created, rough_tokens(sent, 4), sent, rid)
    if not call.background:
        return Job(call.stream, knobs, lambda n: plan_response(dataclasses.replace(run, number=n)))
    if knobs.status is not None:
        return simple_reply(
            knobs.status, b'{"message":"simulated failure"}', rid, "application/json"
        )
    # background wins over stream: the queued object now, the run "continues"
    run = dataclasses.replace(run, number=state.take_number())
    queued, task = background(run, time.monotonic())
    with state.cond:
        state.store.background[run.response_id] = task
        state.cond.notify_all()
    return json_reply(200, queued, rid)


def _stored_response(state: State, method: str, rest: str, rid: str) -> Iterator[Step]:
    response_id, _, action = rest.partition("/")
    if not response_id or "/" in action or action not in ("", "cancel"):
        return simple_reply(404, b"", rid)
    allowed = ("POST",) if action == "cancel" else ("GET", "DELETE")
    if method not in allowed:
        return simple_reply(405, b"", rid)
    now = time.monotonic()
    with state.cond:
        if action == "cancel":
            found = state.store.cancel(response_id, now)
        elif method == "GET":
            found = state.store.get(response_id, now)
        elif state.store.delete(response_id, now):
            found = {"deleted": True, "id": response_id, "object": "response.deleted"}
        else:
            found = None
        state.cond.notify_all()
    if found is not None:
        return json_reply(200, found, rid)
    suffix = " or cannot be cancelled" if action == "cancel" else ""
    message = f"Response with ID '{response_id}' not found{suffix}"
    return json_reply(404, {"message": message}, rid)


# ------------------------------------------------------- anthropic messages


def _messages(state: State, path: str, body: bytes, headers: dict[str, str], rid: str) -> Reply:
    counting = path == _COUNT_TOKENS
    try:
        call = parse_messages(read_json(body, headers), counting=counting)
        with state.cond:
            found = state.routes.resolve(call.model)
            message = state.routes.unknown_model_message(call.model)
        if found is None:
            raise Reject.handler(400, message)
        if not found.serves("chat"):
            raise Reject.handler(400, INCOMPATIBLE)
        faults = COUNT_TOKENS_FAULTS if counting else MESSAGES_FAULTS
        knobs = request_knobs(state, call.directive_text, faults, path)
    except Reject as reject:
        return refusal(reject.status, reject.message, rid)
    tokens = rough_tokens(call.texts, 4)
    if counting:
        return plan_count(knobs, tokens, rid)
    turn = Turn(call, knobs, 0, found.model_id, tokens, rid)
    return Job(call.stream, knobs, lambda n: plan_message(dataclasses.replace(turn, number=n)))


# ------------------------------------------------------------- embeddings


def _embeddings(state: State, body: bytes, headers: dict[str, str], rid: str) -> Reply:
    try:
        call = parse_embeddings(read_json(body, headers))
        with state.cond:
            found = state.routes.resolve(call.model)
            message = state.routes.unknown_model_message(call.model)
        if found is None:
            raise Reject.handler(422, message)
        if not found.serves("embeddings"):
            raise Reject.handler(422, INCOMPATIBLE)
        check(call)
        knobs = request_knobs(state, call.directive_text, EMBEDDINGS_FAULTS, "/v1/embeddings")
    except Reject as reject:
        return reject.reply(rid)
    return Job(False, knobs, lambda _number: plan_embeddings(call, knobs, rid))


# ------------------------------------------------------- models and admin


def _models(state: State, rid: str) -> Iterator[Step]:
    with state.cond:
        fault = state.models_fault
        listing = state.routes.models_list(state.created)
    if fault == "hang":
        return iter([Op.HANG])
    if fault == "bad_body":
        return simple_reply(200, b'{"object":"list","data":[{"id":', rid, "application/json")
    return json_reply(200, listing, rid)


def _admin(state: State, path: str, body: bytes, rid: str) -> Iterator[Step]:
    if path == "/metrics":
        with state.cond:
            return metrics_reply(state.engine, state.active, rid)
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
        return text_reply(400, NOT_JSON, rid)
    model_id = parsed.get("model_id") if isinstance(parsed, dict) else None
    if not isinstance(model_id, str):
        return Reject.shape("missing field `model_id`").reply(rid)
    with state.cond:
        found = state.routes.lookup(model_id)
        if found is None:
            status: str | None = "not_found"
        else:
            if path == "/v1/models/unload":
                found.status = "unloaded"
            elif path == "/v1/models/reload":
                found.status = "loaded"
            status = found.status
        state.cond.notify_all()
    return json_reply(200, {"model_id": model_id, "status": status}, rid)
