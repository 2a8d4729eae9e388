"""Generated agentic runs (spec §22 "Events"): every valid run passes whole,
and each kind of breach applied to one is caught as ``upstream_protocol_error``.

A run is what the worker sends and what the gateway decides: content
chunks, rounds (strictly increasing indexes below the forwarded maximum),
each with an optional approval the gateway decides, files only after an
approve, and a ``complete`` that reports output only after an approve (else
the worker's denial shape); then the answer's end. The runner plays the
relay: it decides each approval as soon as the machine returns it.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.apis.agents import AgentEvents, ApprovalRequired, EventLimits, RoundState
from gateway.core.errors import GatewayError
from tests.apis.agents.worker import (
    SESSION,
    TOOLS,
    Tool,
    approval,
    calling,
    complete,
    denial,
    produced,
)

FILE_BOUND = 64


@dataclass(frozen=True)
class Step:
    kind: str  # content | event | finish
    round: int = -1
    event: tuple[str, str] | None = None
    what: str = ""  # calling | approval | file | complete (for mutations)


@dataclass
class Run:
    max_rounds: int
    steps: list[Step]
    decisions: dict[int, bool] = field(default_factory=dict)
    tools: dict[int, Tool] = field(default_factory=dict)

    def rounds(self) -> list[int]:
        return [s.round for s in self.steps if s.what == "calling"]


CONTENT = Step("content")
FINISH = Step("finish")


@st.composite
def runs(draw: st.DrawFn, min_rounds: int = 0) -> Run:
    max_rounds = draw(st.integers(max(1, min_rounds), 6))
    count = draw(st.integers(min_rounds, max_rounds))
    indexes = sorted(draw(st.sets(st.integers(0, max_rounds - 1), min_size=count, max_size=count)))
    run = Run(max_rounds, [CONTENT] * draw(st.integers(0, 2)))
    for r in indexes:
        tool = draw(st.sampled_from(TOOLS))
        run.tools[r] = tool
        run.steps.append(Step("event", r, calling(r, tool), "calling"))
        approved = False
        if draw(st.booleans()):
            run.steps.append(Step("event", r, approval(r, tool), "approval"))
            approved = run.decisions[r] = draw(st.booleans())
        if approved:
            for i in range(draw(st.integers(0, 3))):
                body = draw(st.one_of(st.binary(max_size=FILE_BOUND), st.text(max_size=16)))
                run.steps.append(Step("event", r, produced(r, f"f{i}.bin", body), "file"))
        ran = approved and draw(st.booleans())  # approved, yet the worker may deny (a timeout)
        data = None if ran else denial(tool)
        run.steps.append(Step("event", r, complete(r, tool, data), "complete"))
        run.steps += [CONTENT] * draw(st.integers(0, 2))
    run.steps.append(FINISH)
    return run


def play(run: Run) -> AgentEvents:
    m = AgentEvents(
        EventLimits(
            max_tool_rounds=run.max_rounds,
            files_max_bytes=FILE_BOUND * 4,
            files_max_count=5,
            session_id=SESSION,
        )
    )
    for step in run.steps:
        if step.kind == "content":
            m.on_content()
        elif step.kind == "finish":
            m.finish()
        else:
            assert step.event is not None
            event = m.on_event(*step.event)
            if isinstance(event, ApprovalRequired):
                m.on_decision(event.round, run.decisions.get(event.round, False))
    return m


def caught(run: Run) -> GatewayError:
    try:
        play(run)
    except GatewayError as exc:
        assert exc.code == "upstream_protocol_error"
        assert exc.outcome == "protocol_error"
        return exc
    raise AssertionError("the breach was not caught")


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(runs())
def test_every_valid_run_passes_whole(run: Run) -> None:
    m = play(run)
    assert m.state is RoundState.FINISHED
    assert m.rounds == len(run.rounds())
    assert m.files_kept + m.files_dropped == sum(s.what == "file" for s in run.steps)


def _index(run: Run, what: str, choice: int) -> int:
    spots = [i for i, s in enumerate(run.steps) if s.what == what]
    assume(spots)
    return spots[choice % len(spots)]


@SETTINGS
@given(runs(min_rounds=1), st.integers(0, 100))
def test_dropping_a_calling_is_caught(run: Run, choice: int) -> None:
    del run.steps[_index(run, "calling", choice)]
    caught(run)


@SETTINGS
@given(runs(min_rounds=1), st.integers(0, 100))
def test_swapping_two_neighbouring_events_is_caught(run: Run, choice: int) -> None:
    events = [i for i, s in enumerate(run.steps) if s.kind == "event"]
    pairs = [
        (a, b)
        for a, b in itertools.pairwise(events)
        if not (run.steps[a].what == run.steps[b].what == "file")
    ]
    assume(pairs)
    a, b = pairs[choice % len(pairs)]
    run.steps[a], run.steps[b] = run.steps[b], run.steps[a]
    caught(run)


@SETTINGS
@given(runs(min_rounds=1), st.integers(0, 100))
def test_repeating_a_round_is_caught(run: Run, choice: int) -> None:
    start = _index(run, "calling", choice)
    end = next(i for i in range(start, len(run.steps)) if run.steps[i].what == "complete")
    run.steps[end + 1 : end + 1] = run.steps[start : end + 1]
    caught(run)


@SETTINGS
@given(runs(), st.sampled_from(TOOLS))
def test_a_round_at_the_maximum_is_caught(run: Run, tool: Tool) -> None:
    r = run.max_rounds
    extra = [Step("event", r, calling(r, tool), "calling")]
    extra.append(Step("event", r, complete(r, tool, denial(tool)), "complete"))
    run.steps[-1:-1] = extra
    caught(run)


@SETTINGS
@given(runs(), st.integers(0, 100), st.sampled_from(["agentic_tool_call", "error", "ping", "x"]))
def test_an_unknown_event_anywhere_is_caught(run: Run, where: int, name: str) -> None:
    at = where % len(run.steps)
    run.steps.insert(at, Step("event", -1, (name, "{}"), "unknown"))
    caught(run)


@SETTINGS
@given(runs(min_rounds=1), st.integers(0, 100))
def test_content_inside_a_round_is_caught(run: Run, choice: int) -> None:
    inside = [
        i
        for i, s in enumerate(run.steps)
        if s.what in ("calling", "approval", "file")  # content right after one is inside
    ]
    at = inside[choice % len(inside)]
    run.steps.insert(at + 1, CONTENT)
    caught(run)


@SETTINGS
@given(runs(min_rounds=1), st.integers(0, 100))
def test_a_second_approval_is_caught(run: Run, choice: int) -> None:
    at = _index(run, "calling", choice)
    r, tool = run.steps[at].round, run.tools[run.steps[at].round]
    second = Step("event", r, approval(r, tool, approval_id="appr_" + "f" * 32), "approval")
    if run.steps[at + 1].what == "approval":
        run.steps.insert(at + 2, second)
    else:
        run.decisions[r] = False
        run.steps[at + 1 : at + 1] = [Step("event", r, approval(r, tool), "approval"), second]
    caught(run)


@SETTINGS
@given(runs(min_rounds=1), st.integers(0, 100))
def test_ending_inside_a_round_is_caught(run: Run, choice: int) -> None:
    at = _index(run, "calling", choice)
    end = next(i for i in range(at, len(run.steps)) if run.steps[i].what == "complete")
    cut = at + choice % (end - at)  # after the calling, an approval or a file of the round
    run.steps[cut + 1 :] = [FINISH]
    caught(run)


@SETTINGS
@given(runs(min_rounds=1), st.integers(0, 100))
def test_output_after_a_deny_is_caught(run: Run, choice: int) -> None:
    at = _index(run, "calling", choice)
    r, tool = run.steps[at].round, run.tools[run.steps[at].round]
    end = next(i for i in range(at, len(run.steps)) if run.steps[i].what == "complete")
    # The gateway denies this round, and the worker reports the tool as run.
    run.decisions[r] = False
    body = [Step("event", r, approval(r, tool), "approval")]
    run.steps[at + 1 : end + 1] = [
        *body,
        dataclasses.replace(run.steps[end], event=complete(r, tool)),
    ]
    caught(run)


def test_the_generator_makes_every_shape() -> None:
    """A deterministic run with each part, so the properties are not vacuous."""
    tool: Any = TOOLS[0]
    run = Run(
        3,
        [
            CONTENT,
            Step("event", 0, calling(0, tool), "calling"),
            Step("event", 0, approval(0, tool), "approval"),
            Step("event", 0, produced(0, "a.bin", b"ab"), "file"),
            Step("event", 0, complete(0, tool), "complete"),
            CONTENT,
            Step("event", 2, calling(2, tool), "calling"),
            Step("event", 2, complete(2, tool, denial(tool)), "complete"),
            FINISH,
        ],
        decisions={0: True},
        tools={0: tool, 2: tool},
    )
    m = play(run)
    assert (m.rounds, m.files_kept, m.state) == (2, 1, RoundState.FINISHED)
