"""What every route handler shares: the :class:`Job` an inference handler
returns, reading a JSON body as axum does, and a request's knobs.

Order of the checks, as the real server's: content type (415), JSON syntax
(400), then the handler's; the ``[[sim ...]]`` directives come last (400
``simulator: ...``). A fault the route does not implement is refused, and so is
an ``agent``/``agent_fault`` directive on a request the worker would not run
agentically (a default set on the simulator is just not used there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.simulator.knobs import (
    DirectiveError,
    SimKnobs,
    apply_directives,
    check_fault,
)
from gateway.testing.simulator.plans import DESERIALIZE, PlanStep, Reject, Step
from gateway.testing.simulator.state import State

NOT_JSON = DESERIALIZE + "expected value at line 1 column 1"


@dataclass(frozen=True, slots=True)
class Job:
    """An inference reply: built once admitted, from the engine's next request number.

    ``numbers`` is how many engine request numbers the job takes (an agentic
    run is one engine request a round, each with its own id); ``build`` gets
    the first of them.
    """

    stream: bool
    knobs: SimKnobs
    build: Callable[[int], Iterator[PlanStep]]
    numbers: int = 1


Reply = Iterator[Step] | Job


def is_json_type(headers: dict[str, str]) -> bool:
    mime = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


def read_json(body: bytes, headers: dict[str, str]) -> Any:
    """axum's ``Json`` extractor: 415 without a JSON content type, 400 on bad syntax."""
    if not is_json_type(headers):
        raise Reject(415, "Expected request with `Content-Type: application/json`", as_json=False)
    try:
        return orjson.loads(body)
    except ValueError as exc:
        raise Reject(400, NOT_JSON, as_json=False) from exc


def request_knobs(
    state: State, text: str, faults: frozenset[str], path: str, *, agentic: bool = False
) -> SimKnobs:
    """The request's knobs: the defaults, then its directives; a foreign fault is refused."""
    with state.cond:
        base, use_directives = state.knobs, state.directives
    knobs = base
    try:
        if use_directives:
            knobs = apply_directives(text, base)
        check_fault(knobs, faults, path)
    except DirectiveError as exc:
        raise Reject(400, str(exc), as_json=False) from exc
    if not agentic and (knobs.agent, knobs.agent_fault) != (base.agent, base.agent_fault):
        problem = (
            "simulator: agent and agent_fault need a request the worker runs agentically "
            "(chat with web_search_options, a code_interpreter tool or max_tool_rounds)"
        )
        raise Reject(400, problem, as_json=False)
    return knobs
