"""The handlers of ``/v1/images/generations`` and ``/v1/audio/speech``: read the
request (images.py, speech.py), resolve its model, take its knobs, return a
:class:`~handling.Job` (both are engine requests: they take a request number
and count as active while generated). Runs on the event loop.

Order, as the worker's handlers: content type, JSON, shape (axum's 422 text),
the model (unknown: 500 ``{"message"}``), speech's format check (422), the
engine's category check (a route of another kind: 422 ``{"message"}``), then
the directives and the simulator's own bounds (400 ``simulator: ...``).
"""

from __future__ import annotations

from gateway.testing.simulator.handling import Job, Reply, read_json, request_knobs
from gateway.testing.simulator.images import check_size, parse_image, plan_image
from gateway.testing.simulator.knobs import IMAGES_FAULTS, SPEECH_FAULTS
from gateway.testing.simulator.plans import Reject
from gateway.testing.simulator.routes import INCOMPATIBLE, Route
from gateway.testing.simulator.speech import (
    check_fault_format,
    check_format,
    parse_speech,
    plan_speech,
)
from gateway.testing.simulator.state import State

IMAGES = "/v1/images/generations"
SPEECH = "/v1/audio/speech"


def _route(state: State, model: str) -> tuple[Route, int, int]:
    """(route, id seed, created) of ``model``; Reject 500 when it names none."""
    with state.cond:
        found = state.routes.resolve(model)
        message = state.routes.unknown_model_message(model)
        seed, created = state.id_seed, state.created
    if found is None:
        raise Reject.handler(500, message)
    return found, seed, created


def images(state: State, body: bytes, headers: dict[str, str], rid: str) -> Reply:
    try:
        call = parse_image(read_json(body, headers))
        found, seed, created = _route(state, call.model)
        if not found.serves("image"):
            raise Reject.handler(422, INCOMPATIBLE)
        knobs = request_knobs(state, call.prompt, IMAGES_FAULTS, IMAGES)
        problem = check_size(call)
        if problem is not None:
            raise Reject(400, problem, as_json=False)
    except Reject as reject:
        return reject.reply(rid)
    return Job(False, knobs, lambda n: plan_image(call, knobs, seed, n, created, rid))


def speech(state: State, body: bytes, headers: dict[str, str], rid: str) -> Reply:
    try:
        call = parse_speech(read_json(body, headers))
        found, _, _ = _route(state, call.model)
        check_format(call)
        if not found.serves("speech"):
            raise Reject.handler(422, INCOMPATIBLE)
        knobs = request_knobs(state, call.input, SPEECH_FAULTS, SPEECH)
        check_fault_format(call, knobs)
    except Reject as reject:
        return reject.reply(rid)
    return Job(False, knobs, lambda _number: plan_speech(call, knobs, rid))
