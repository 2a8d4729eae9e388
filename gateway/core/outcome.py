"""A request's receipt outcome, decided once from what happened (spec §9, §10, §12). Pure.

The pipeline records facts as the request goes (:class:`Facts`) and calls
:func:`decide` once, in its one ``finally``. Precedence, first match wins:

1. the caller went away or stopped reading -> ``canceled`` (whatever else
   failed meanwhile: the caller's leaving is what ended it);
2. a bug in the gateway -> ``incomplete`` / ``internal_error``;
3. a refusal or a worker failure -> that error's outcome (``rejected`` for
   refusals; §12's column for worker failures);
4. the answer reached the caller whole -> the dialect's outcome (``complete``,
   ``length``, …);
5. a drain past its grace ended it -> ``incomplete`` / ``upstream_unavailable``;
6. anything else -> ``incomplete``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Facts:
    disconnected: bool = False
    stalled: bool = False
    internal: bool = False
    error_code: str | None = None
    error_outcome: str | None = None
    #: the answer's end (stream terminator or JSON body) was handed to the server
    finished: bool = False
    #: the dialect's outcome for a valid answer
    answer_outcome: str = "complete"
    shutdown: bool = False
    #: the gateway closed the worker's response before its end
    upstream_closed: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: str
    error_code: str | None
    cancellation: tuple[str, ...]


def decide(facts: Facts) -> Decision:
    closed = ("upstream_closed",) if facts.upstream_closed else ()
    if facts.disconnected or facts.stalled:
        state = "caller_disconnected" if facts.disconnected else "caller_stalled"
        return Decision("canceled", None, (state, *closed))
    if facts.internal:
        return Decision("incomplete", "internal_error", closed)
    if facts.error_code is not None:
        return Decision(facts.error_outcome or "rejected", facts.error_code, closed)
    if facts.finished:
        return Decision(facts.answer_outcome, None, closed)
    if facts.shutdown:
        return Decision("incomplete", "upstream_unavailable", closed)
    return Decision("incomplete", None, closed)
