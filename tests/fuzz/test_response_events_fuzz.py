"""Fuzz the Responses named-event state machine (spec §14, ``gateway/apis/responses/events.py``).

Properties, with small framing bounds so that mutations hit them often:

- **one decision, whatever the split**: fed random bytes, SSE-shaped
  fragments, mutated fixture files (``fixtures/sse/responses/*.sse``) or
  fixture events with a JSON value swapped, split anywhere, the validator
  yields the same events (name, data, text) and ends with the same error
  (code, outcome, message) or the same ``Done`` as when fed whole;
- **bounded**: whenever it waits for data it holds at most one line and one
  event of pending bytes (``StreamValidator.pending_bytes``);
- **one error sink**: the only exception is :class:`GatewayError`, always
  with an ``upstream_*`` code; the dialect on top (``on_item``,
  ``error_frame``, ``report``, ``answer``) raises nothing, and its error
  event is numbered right after the last event it passed on;
- **valid streams pass**: generated streams in the worker's grammar
  (messages, reasoning, refusals and function calls; keep-alives and
  comments anywhere, ``id:``/``retry:`` lines, multi-line data, the
  ``event:`` line anywhere in its event, LF/CRLF/CR line ends, a BOM) are
  accepted whole and split; the assembled text equals the deltas joined, and
  what the caller is sent is itself a valid stream with the same events.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.apis.base import Plan, StreamBounds, TextNul
from gateway.apis.responses.events import (
    ResponseEvent,
    ResponsesDialect,
    ResponsesGrammar,
    ResponsesValidator,
)
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, Framing, KeepAlive
from tests.fuzz.budget import budget
from tests.fuzz.shapes import json_paths, mutate, split
from tests.support.sse import RESPONSE_ID, response_object

pytestmark = pytest.mark.fuzz

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sse" / "responses"
EXPECTED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "expected.json").read_text())
SEEDS = {p.name: p.read_bytes() for p in sorted(FIXTURES.glob("*.sse"))}
LINE, EVENT = 640, 1280
SMALL = Framing(max_line_bytes=LINE, max_event_bytes=EVENT, max_stream_bytes=8192, max_events=48)
LOADERS: dict[str, Callable[[bytes | str], Any]] = {"json": json.loads, "orjson": orjson.loads}
CODES = {"upstream_protocol_error", "upstream_error", "upstream_unavailable"}
ALIAS = "alias-x"
DONE_FRAME = b"data: [DONE]\n\n"

# ------------------------------------------------------------------ the decision


@dataclass
class Decision:
    """What the validator made of one stream: its output in order, then how it ended."""

    out: list[tuple[Any, ...]] = field(default_factory=list)
    error: tuple[str, str, str] | None = None
    grammar: ResponsesGrammar | None = None

    @property
    def items(self) -> list[tuple[Any, ...]]:
        return [o for o in self.out if o[0] == "event"]


def _grammar(rules: dict[str, Any], loader: str = "orjson") -> ResponsesGrammar:
    return ResponsesGrammar(loads=LOADERS[loader], **{"max_output_tokens": None, **rules})


def decide(
    pieces: list[bytes], rules: dict[str, Any], framing: Framing = SMALL, loader: str = "orjson"
) -> Decision:
    """Feed ``pieces`` then EOF; the pending-bytes bound is checked after every feed."""
    validator = ResponsesValidator(framing, _grammar(rules, loader))
    decision = Decision(grammar=validator.grammar)
    bound = framing.max_line_bytes + framing.max_event_bytes
    try:
        for piece in [*pieces, b""]:
            validator.receive_data(piece)
            while (item := validator.next_event()) is not NEED_DATA:
                if isinstance(item, Done):
                    decision.out.append(("done",))
                    return decision
                if isinstance(item, KeepAlive):
                    decision.out.append(("keepalive",))
                else:
                    assert isinstance(item, ResponseEvent)
                    # repr: NaN (json.loads accepts it) is not equal to itself
                    decision.out.append(("event", item.name, repr(item.data), item.text))
            assert validator.pending_bytes <= bound, validator.pending_bytes
    except GatewayError as exc:
        assert exc.code in CODES, exc.code
        assert 500 <= exc.status < 600
        assert exc.message and exc.message == str(exc.message)
        decision.error = (exc.code, exc.outcome, exc.message)
        return decision
    raise AssertionError("no decision at EOF")


def same_whole_and_split(
    data: bytes, sizes: list[int], rules: dict[str, Any], loader: str = "orjson"
) -> Decision:
    whole = decide([data], rules, loader=loader)
    parts = decide(split(data, sizes), rules, loader=loader)
    assert parts.out == whole.out
    assert parts.error == whole.error
    return whole


# ------------------------------------------------------------------ the dialect


def _plan(stream: bool, max_tokens: int | None) -> Plan:
    return Plan("responses", ALIAS, {}, stream, True, max_tokens, 10, "n")


def through_dialect(
    data: bytes,
    *,
    collect: bool,
    max_tokens: int | None = 64,
    text_nul: TextNul = "replace",
    framing: Framing = SMALL,
) -> tuple[list[bytes], bool]:
    """Drive :class:`ResponsesDialect` as the relay and pipeline do; its frames and
    whether the stream ended with ``Done``. Nothing but GatewayError may escape the
    validator, and nothing at all the dialect."""
    dialect = ResponsesDialect(
        _plan(not collect, max_tokens), StreamBounds(framing, text_nul=text_nul), collect=collect
    )
    frames: list[bytes] = []
    last_seq: int | None = None
    source = dialect.source
    source.receive_data(data)
    source.receive_data(b"")
    try:
        while not isinstance(item := source.next_event(), Done):
            assert item is not NEED_DATA, "no decision at EOF"
            if isinstance(item, ResponseEvent):
                last_seq = item.data["sequence_number"]
                frame = dialect.on_item(item)
                assert (frame is None) == collect
                if frame is not None:
                    frames.append(frame)
    except GatewayError as exc:
        name, _, body = dialect.error_frame(exc).partition(b"\ndata: ")
        error = orjson.loads(body)
        assert name == b"event: error"
        assert (error["type"], error["code"], error["param"]) == ("error", exc.code, None)
        assert error["sequence_number"] == (0 if last_seq is None else last_seq + 1)
        dialect.report()
        return frames, False
    report = dialect.report()
    assert report.response_id is not None
    if collect:
        answer = dialect.answer({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
        assert answer["model"] == ALIAS
        orjson.dumps(answer)
    return frames, True


# ------------------------------------------------------------------ strategies

SIZES = st.lists(st.integers(1, 97), max_size=40)
LOADER = st.sampled_from(sorted(LOADERS))
SEED_NAMES = st.sampled_from(sorted(SEEDS))


def _lines(data: bytes) -> list[bytes]:
    return re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", data)


#: every line of every fixture, plus odd bytes: random streams that look like SSE
FRAGMENTS = sorted(
    {line for data in SEEDS.values() for line in _lines(data)}
    | {
        b"\n",
        b"\r",
        b"\r\n",
        b":\n",
        b"\xef\xbb\xbf",
        b"\xff\xfe",
        b"\xf0\x9f",
        b"\x00",
        b"event: error\n",
        b"event:\n",
        b"event: response.output_text.delta\n",
        b"data:",
        b"data: [DONE]\n",
        b"data:[DONE]\n",
        b"data: {}\n",
        b"data: {\n",
        b'data: "x"\n',
        b"id: 7\n",
        b"retry: 10\n",
        b"x" * 700,
    }
)
sse_soup = st.lists(st.sampled_from(FRAGMENTS), max_size=30).map(b"".join)

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=12),
        st.sampled_from(["", "\x00", RESPONSE_ID, "resp_other", "response.completed"]),
    ),
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)
    ),
    max_leaves=6,
)

#: a value of the wrong type for wherever it lands
RETYPED = st.sampled_from([0, 7, -1, 1.5, True, False, None, "", "x", [], [1], {}, {"a": 1}])

# -- valid streams in the worker's grammar -------------------------------------

TEXT = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.sampled_from(["", "\x00", "a\x00b", " wörld 🙂", "\r\n", "\u2028", "data: [DONE]\n\n"]),
)
EOLS = (b"\n", b"\r\n", b"\r")


@dataclass
class Item:
    """One output item of a generated answer and the events that carry it."""

    kind: str
    deltas: list[str]


@st.composite
def items(draw: st.DrawFn) -> Item:
    kind = draw(st.sampled_from(["message", "message", "reasoning", "refusal", "function_call"]))
    return Item(kind, draw(st.lists(TEXT, max_size=5)))


def _item_events(item: Item, index: int) -> list[tuple[str, dict[str, Any]]]:
    at = {"output_index": index}
    text = "".join(item.deltas)
    if item.kind == "function_call":
        call = {"type": "function_call", "id": f"fc_{index}", "call_id": f"call-{index}"}
        return [
            ("response.output_item.added", {**at, "item": {**call, "arguments": ""}}),
            *(
                (
                    "response.function_call_arguments.delta",
                    {**at, "item_id": call["id"], "delta": d},
                )
                for d in item.deltas
            ),
            ("response.function_call_arguments.done", {**at, "arguments": text}),
            ("response.output_item.done", {**at, "item": {**call, "arguments": text}}),
        ]
    part_at = {**at, "content_index": 0}
    family = {
        "message": "response.output_text",
        "reasoning": "response.reasoning_text",
        "refusal": "response.refusal",
    }[item.kind]
    added: list[tuple[str, dict[str, Any]]] = [
        ("response.output_item.added", {**at, "item": {"type": item.kind, "id": f"it_{index}"}})
    ]
    if item.kind == "message":
        added.append(("response.content_part.added", {**part_at, "part": {"type": "output_text"}}))
    return [
        *added,
        *((f"{family}.delta", {**part_at, "delta": d}) for d in item.deltas),
        (f"{family}.done", {**part_at, "text": text}),
        ("response.output_item.done", {**at, "item": {"type": item.kind, "id": f"it_{index}"}}),
    ]


@dataclass
class Generated:
    data: bytes
    names: list[str]
    keepalives: int
    text: str  # the message deltas joined, as the worker sent them
    terminal: str
    usage: dict[str, Any] | None
    max_output_tokens: int | None
    text_nul: TextNul


@st.composite
def events(draw: st.DrawFn) -> tuple[list[tuple[str, dict[str, Any]]], list[Item], str, Any]:
    answer = draw(st.lists(items(), max_size=4))
    body: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": response_object("queued")})
    ]
    if draw(st.booleans()):
        body.append(("response.in_progress", {"response": response_object()}))
    for index, item in enumerate(answer):
        body += _item_events(item, index)
    terminal = draw(
        st.sampled_from(["response.completed", "response.incomplete", "response.failed"])
    )
    outputs = sum(len(i.deltas) for i in answer)
    usage: dict[str, Any] | None = None
    if terminal == "response.completed" or draw(st.booleans()):
        prompt = draw(st.integers(0, 10_000))
        usage = {"input_tokens": prompt, "output_tokens": outputs, "total_tokens": prompt + outputs}
        if draw(st.booleans()):
            usage = {**usage, "output_tokens_details": {"reasoning_tokens": 0}}
    final = response_object(terminal.removeprefix("response."), output=[], usage=usage)
    if terminal == "response.incomplete":
        reason = draw(st.sampled_from(["max_output_tokens", "content_filter"]))
        final["incomplete_details"] = {"reason": reason}
    body.append((terminal, {"response": final}))
    start = draw(st.sampled_from([0, 0, 0, 7]))
    numbered = [
        (name, {"type": name, "sequence_number": start + n, **obj})
        for n, (name, obj) in enumerate(body)
    ]
    return numbered, answer, terminal, usage


class _Lines:
    """Lines with line ends chosen per line; a CR end is never followed by an empty
    LF-ended line (the two would read as one CRLF)."""

    def __init__(self, rng: random.Random, eols: tuple[bytes, ...]) -> None:
        self.rng = rng
        self.eols = eols
        self.out = bytearray()
        self.last = b""

    def add(self, line: bytes) -> None:
        eol = self.rng.choice(self.eols)
        if self.last == b"\r" and not line and eol == b"\n":
            eol = b"\r"
        self.out += line + eol
        self.last = eol


COMMENTS = (b":", b": keep-alive", b":\xc3\xa9t\xc3\xa9", b"::", b": data: [DONE]")


@st.composite
def valid_streams(draw: st.DrawFn) -> Generated:
    """Semantic content drawn; framing choices (line ends, spacing, where keep-alives
    and extra lines go) from one drawn ``Random``, which keeps generation fast."""
    numbered, answer, terminal, usage = draw(events())
    rng = draw(st.randoms(use_true_random=False))
    lines = _Lines(rng, rng.choice([EOLS[:1], EOLS[1:2], EOLS[2:], EOLS]))
    if rng.random() < 0.2:
        lines.out += b"\xef\xbb\xbf"
    keepalives = 0

    def maybe_keepalives() -> None:
        nonlocal keepalives
        for _ in range(rng.choice((0, 0, 0, 1, 2))):
            for _ in range(rng.randint(1, 2)):
                lines.add(rng.choice(COMMENTS))
            lines.add(b"")
            keepalives += 1
        if rng.random() < 0.1:
            lines.add(b"")  # a blank line with no event open dispatches nothing

    for name, obj in numbered:
        maybe_keepalives()
        text = json.dumps(obj, ensure_ascii=rng.random() < 0.5, indent=rng.choice((None, 0, 1)))
        fields = [rng.choice((b"data: ", b"data:")) + line.encode() for line in text.split("\n")]
        head = rng.choice((b"event: ", b"event:")) + name.encode()
        fields.insert(rng.randint(0, len(fields)), head)
        for _ in range(rng.choice((0, 0, 0, 1, 2))):
            extra = rng.choice((b"id: 7", b"retry: 10", b"x", *COMMENTS))
            fields.insert(rng.randint(0, len(fields)), extra)
        for line in fields:
            lines.add(line)
        lines.add(b"")
    maybe_keepalives()
    lines.add(rng.choice((b"data: [DONE]", b"data:[DONE]")))
    lines.add(b"")
    text = "".join(d for i in answer if i.kind == "message" for d in i.deltas)
    outputs = sum(len(i.deltas) for i in answer)
    return Generated(
        data=bytes(lines.out),
        names=[name for name, _ in numbered],
        keepalives=keepalives,
        text=text,
        terminal=terminal,
        usage=usage,
        max_output_tokens=draw(st.sampled_from([None, outputs, outputs + 5])),
        text_nul=draw(st.sampled_from(["replace", "pass"])),
    )


def _expected_text(raw: str, text_nul: TextNul) -> str:
    return raw.replace("\x00", "\ufffd") if text_nul == "replace" else raw


# ------------------------------------------------------------------ structure-aware edits


def _parse_events(data: bytes) -> list[tuple[str | None, Any]]:
    """A fixture's events as (name, JSON or raw data); keep-alives dropped."""
    out: list[tuple[str | None, Any]] = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, payload = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                payload = line[6:].decode()
        if payload is None:
            continue
        try:
            out.append((name, json.loads(payload)))
        except ValueError:
            out.append((name, payload))
    return out


def _encode(events: list[tuple[str | None, Any]]) -> bytes:
    out = bytearray()
    for name, payload in events:
        if name is not None:
            out += b"event: " + name.encode() + b"\n"
        raw = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        out += b"data: " + raw.encode("utf-8", "surrogatepass") + b"\n\n"
    return bytes(out)


@st.composite
def edited_fixtures(draw: st.DrawFn) -> tuple[str, bytes]:
    """A fixture whose events had 1-2 JSON values replaced or deleted, or a name swapped."""
    name = draw(st.sampled_from([n for n in sorted(SEEDS) if n.startswith(("valid", "nul"))]))
    events = _parse_events(SEEDS[name])
    for _ in range(draw(st.integers(1, 2))):
        terminal = len(events) - 2  # the last is [DONE]
        index = terminal if draw(st.booleans()) else draw(st.integers(0, len(events) - 1))
        _, payload = events[index]
        if draw(st.integers(0, 9)) == 0 or not isinstance(payload, dict | list):
            swapped = draw(st.sampled_from([None, "error", "response.created", *_NAMES]))
            events[index] = (swapped, payload)
            continue
        # Shallow paths as often as deep ones (a type confusion near the top,
        # ``response.output`` or ``usage``, matters most); ``type`` and
        # ``sequence_number``, checked first of all, only now and then.
        depth = draw(st.sampled_from([2, 3, 99]))
        early = draw(st.integers(0, 9)) == 0
        paths = [
            p
            for p in json_paths(payload)
            if 0 < len(p) <= depth and (early or p not in {("type",), ("sequence_number",)})
        ]
        path = draw(st.sampled_from(paths or [()]))
        if not path:
            continue
        parent = payload
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) or isinstance(parent, list):
            parent[path[-1]] = copy.deepcopy(draw(st.one_of(RETYPED, json_values)))
        else:
            del parent[path[-1]]
    return name, _encode(events)


_NAMES = sorted(
    {
        "response.output_text.delta",
        "response.completed",
        "response.incomplete",
        "response.failed",
        "response.function_call_arguments.delta",
        "response.web_search_call.searching",
    }
)

# ------------------------------------------------------------------ tests


@budget(150)
@given(data=st.one_of(st.binary(max_size=2048), sse_soup), sizes=SIZES, loader=LOADER)
def test_random_bytes_decide_alike_split_or_whole(
    data: bytes, sizes: list[int], loader: str
) -> None:
    same_whole_and_split(data, sizes, {"max_output_tokens": 64}, loader)


@budget(200)
@given(
    name=SEED_NAMES,
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 16), st.sampled_from("dirc"), st.binary(max_size=8)),
        min_size=1,
        max_size=6,
    ),
    sizes=SIZES,
    loader=LOADER,
)
def test_mutated_fixtures_decide_alike_split_or_whole(
    name: str, edits: list[tuple[int, str, bytes]], sizes: list[int], loader: str
) -> None:
    mutated = mutate(SEEDS[name], edits)
    same_whole_and_split(mutated, sizes, EXPECTED[name]["rules"], loader)
    through_dialect(mutated, collect=False)


@budget(200)
@given(edited=edited_fixtures(), sizes=SIZES, collect=st.booleans())
def test_edited_fixture_events_decide_alike_and_the_dialect_never_raises(
    edited: tuple[str, bytes], sizes: list[int], collect: bool
) -> None:
    name, data = edited
    rules = EXPECTED[name]["rules"]
    same_whole_and_split(data, sizes, rules)
    through_dialect(data, collect=collect, text_nul=rules.get("text_nul", "replace"))


@budget(100)
@given(stream=valid_streams(), sizes=SIZES)
def test_generated_valid_streams_are_accepted_split_anywhere(
    stream: Generated, sizes: list[int]
) -> None:
    rules = {"max_output_tokens": stream.max_output_tokens, "text_nul": stream.text_nul}
    whole = decide([stream.data], rules, Framing())
    assert whole.error is None, whole.error
    assert whole.out[-1] == ("done",)
    split_up = decide(split(stream.data, sizes), rules, Framing())
    assert split_up.out == whole.out and split_up.error is None
    assert [o[1] for o in whole.items] == stream.names
    assert sum(o == ("keepalive",) for o in whole.out) == stream.keepalives
    text = "".join(o[3] for o in whole.items if o[1] == "response.output_text.delta")
    assert text == _expected_text(stream.text, stream.text_nul)
    grammar = whole.grammar
    assert grammar is not None
    assert (grammar.terminal, grammar.usage, grammar.response_id) == (
        stream.terminal,
        stream.usage,
        RESPONSE_ID,
    )


@budget(50)
@given(stream=valid_streams())
def test_what_the_caller_is_sent_is_a_valid_stream_again(stream: Generated) -> None:
    frames, done = through_dialect(
        stream.data,
        collect=False,
        max_tokens=stream.max_output_tokens,
        text_nul=stream.text_nul,
        framing=Framing(),
    )
    assert done
    rules = {"max_output_tokens": stream.max_output_tokens, "text_nul": stream.text_nul}
    again = decide([b"".join(frames) + DONE_FRAME], rules, Framing())
    assert again.error is None and again.out[-1] == ("done",)
    assert [o[1] for o in again.items] == stream.names
    text = "".join(o[3] for o in again.items if o[1] == "response.output_text.delta")
    assert text == _expected_text(stream.text, stream.text_nul)
    assert ALIAS.encode() in frames[0] and b"Qwen/" not in b"".join(frames)
    _, done = through_dialect(
        stream.data, collect=True, max_tokens=stream.max_output_tokens, framing=Framing()
    )
    assert done
