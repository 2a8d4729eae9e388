"""Fidelity: the gateway's non-streaming answer is the engine's non-streaming answer.

The gateway asks the worker for a stream even for a non-streaming caller
(spec §9) and assembles the answer (``ChunkDialect.answer``); the adapter's
non-streaming path is the SDK's own non-streaming call. For every case of the
corpus below (greedy; max_tokens 1-256; stop strings; ``logit_bias`` forcing
EOS, whitespace and control bytes; logprobs) the same request goes three
ways: a stream through the gateway (it must end in ``[DONE]``: no false
protocol errors), a non-streaming request through the gateway (the official
``openai`` SDK), and the non-streaming request straight to the adapter.

Compared: key order at every level, content, finish_reason, stop_sequence,
logprobs (every entry the stream carried, equal; see below), and usage (the
same keys in the same order, equal counts; timings differ per call). A
prompt is seen once before the pair, so both calls find the same
prefix-cache state (``prompt_tokens_details`` appears on the first request
that partly matches a cached prompt).

What cannot come from the stream, documented in docs/engine-lane.md: the
engine sends no chunk (so no logprob entry) for some tokens -- special tokens
(EOS, role markers), a single-token stop string, some byte-fallback tokens --
while its non-streaming answer lists one entry per generated token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import openai

from gateway.apis.chat.dialect import RUST_WHITESPACE
from gateway.testing.engine import modelgen
from tests.support.engine import chat_body
from tests.support.engine_stack import (
    ALIAS,
    EngineStack,
    gateway_body,
    post_json,
    stream_raw,
)

COUNTS = ("completion_tokens", "prompt_tokens", "total_tokens")
SAY, HELLO, ABC, WHAT = "Say something.", "hello", "a b c", "?"
SEA, KARI = "Tell me a story about the sea.", "ka ri to"
UNICODE = "Ünïcödé ✓ 日本語 — ça va?"
SPACED = "  leading spaces and\ttabs\n"
LINES = "line one\nline two\r\nline three"
DIGITS = "0123456789" * 5
FOX = "The quick brown fox jumps over the lazy dog. " * 4

Slice = tuple[int, int]  # a stop string cut from the case's own unstopped greedy text


@dataclass(frozen=True)
class Case:
    prompt: str
    max_tokens: int
    bias: tuple[tuple[str | int, float], ...] = ()  # "eos" or a byte, and the bias
    stop: tuple[str | Slice, ...] = ()
    logprobs: bool = False


CORPUS = [
    # plain greedy, max_tokens across 1..256
    Case(SAY, 1), Case(HELLO, 2), Case(ABC, 3), Case(WHAT, 5), Case(SEA, 8), Case(KARI, 13),
    Case(UNICODE, 21), Case(SPACED, 34), Case(LINES, 55), Case(DIGITS, 89), Case(FOX, 96),
    Case("x", 256), Case(HELLO, 256), Case(WHAT, 64),
    # stop strings: multi-token (a stop_sequence), single-token (a stop token), none matching
    Case(SAY, 40, stop=((10, 13),)), Case(HELLO, 40, stop=((10, 13),)),
    Case(ABC, 60, stop=((20, 22), "zzz")), Case(SEA, 40, stop=("po",)),
    Case(HELLO, 40, stop=("da",)), Case(WHAT, 64, stop=("no such text",)),
    Case(KARI, 30, stop=((1, 2),)), Case(FOX, 100, stop=((30, 34), (5, 8))),
    # EOS: forced at once, and likely after some text
    Case(SAY, 8, bias=(("eos", 100),)), Case(SAY, 40, bias=(("eos", 0.2),)),
    Case(HELLO, 40, bias=(("eos", 0.2),)), Case(SEA, 40, bias=(("eos", 0.2),)),
    # EOS after text that holds a requested stop string the engine did not stop on
    Case(SAY, 40, bias=(("eos", 0.2),), stop=("\ufffd",)),
    Case(HELLO, 40, bias=(("eos", 0.2),), stop=("o\ufffd", "da")),
    # whitespace and control bytes: all-whitespace (trimmed away), CR-only,
    # U+001C (whitespace to Python, not to Rust), leading and trailing whitespace
    Case(HELLO, 3, bias=((0x20, 100),)), Case(HELLO, 4, bias=((0x0A, 100),)),
    Case(HELLO, 5, bias=((0x0D, 100),)), Case(HELLO, 3, bias=((0x09, 100),)),
    Case(HELLO, 3, bias=((0x1C, 100),)), Case(HELLO, 12, bias=((0x0C, 0.2),)),
    Case(HELLO, 7, bias=((0x0A, 0.2),)), Case(HELLO, 12, bias=((0x1C, 0.2),)),
    Case(HELLO, 20, bias=((0x0A, 0.1),)), Case(SAY, 6, bias=((0x20, 0.3),)),
    # logprobs (top 2)
    Case(HELLO, 12, logprobs=True), Case(SAY, 40, logprobs=True), Case(ABC, 64, logprobs=True),
    Case(HELLO, 40, bias=(("eos", 0.2),), logprobs=True),
    Case(SAY, 4, bias=(("eos", 100),), logprobs=True),
    Case(SAY, 40, stop=((10, 13),), logprobs=True), Case(HELLO, 40, stop=("da",), logprobs=True),
]  # fmt: skip


def _body(lane: EngineStack, case: Case) -> dict[str, Any]:
    route = lane.adapter.route
    messages = [{"role": "user", "content": case.prompt}]
    body = chat_body(messages=messages, max_tokens=case.max_tokens)
    if case.bias:
        body["logit_bias"] = {
            str(
                modelgen.eos_token_id(route)
                if t == "eos"
                else modelgen.byte_token_id(route, int(t))
            ): b
            for t, b in case.bias
        }
    if case.logprobs:
        body.update(logprobs=True, top_logprobs=2)
    if case.stop:
        text = None
        stops: list[str] = []
        for stop in case.stop:
            if isinstance(stop, tuple):
                if text is None:
                    text = stream_raw(lane.adapter.base_url, body).stream.text()
                stops.append(text[stop[0] : stop[1]])
            else:
                stops.append(stop)
        assert all(stops), f"a stop string cut from the text is empty: {stops}"
        body["stop"] = stops
    return body


def _logprob_diffs(
    ours: dict[str, Any] | None, theirs: dict[str, Any] | None, streamed: int
) -> tuple[list[str], int]:
    """Differences, and how many engine entries the stream had no entry for."""
    if ours is None or theirs is None:
        return ([] if ours is theirs else [f"logprobs {ours!r} vs {theirs!r}"]), 0
    diffs = [] if list(ours) == list(theirs) == ["content"] else ["logprobs keys"]
    mine, engine = ours["content"], theirs["content"]
    if len(mine) != streamed:
        diffs.append(f"logprobs: {len(mine)} entries, the stream carried {streamed}")
    at = 0
    for entry in mine:
        # the same token: its logprob and its alternatives
        while at < len(engine) and (engine[at]["logprob"], engine[at]["top_logprobs"]) != (
            entry["logprob"],
            entry["top_logprobs"],
        ):
            at += 1
        if at == len(engine):
            diffs.append(f"logprobs entry {entry!r} is not the engine's")
            break
        if entry != engine[at] or list(entry) != list(engine[at]):
            diffs.append(f"logprobs entry {entry!r} vs {engine[at]!r}")
        at += 1
    return diffs, len(engine) - len(mine)


def _diffs(ours: dict[str, Any], theirs: dict[str, Any], streamed: int) -> tuple[list[str], int]:
    diffs = []
    if list(ours) != list(theirs):
        diffs.append(f"top-level keys {list(ours)} vs {list(theirs)}")
    if (ours["object"], ours["system_fingerprint"]) != (theirs["object"], "local"):
        diffs.append("object or system_fingerprint")
    if ours["model"] != ALIAS:
        diffs.append(f"model {ours['model']!r}")
    (mine,), (engine,) = ours["choices"], theirs["choices"]
    if list(mine) != list(engine):
        diffs.append(f"choice keys {list(mine)} vs {list(engine)}")
    for key in ("finish_reason", "index", "stop_sequence"):
        if mine.get(key, "<absent>") != engine.get(key, "<absent>"):
            diffs.append(f"{key} {mine.get(key, '<absent>')!r} vs {engine.get(key, '<absent>')!r}")
    message = dict(engine["message"])
    if isinstance(message["content"], str):  # upstream.text_nul: replace
        message["content"] = message["content"].replace("\x00", "\ufffd")
    if mine["message"] != message or list(mine["message"]) != list(message):
        diffs.append(f"message {mine['message']!r} vs {message!r}")
    lp_diffs, unstreamed = _logprob_diffs(mine.get("logprobs"), engine.get("logprobs"), streamed)
    diffs += lp_diffs
    # one engine entry per generated token: the missing ones are what the stream lacked
    engine_lp = engine.get("logprobs")
    if engine_lp is not None and len(engine_lp["content"]) != theirs["usage"]["completion_tokens"]:
        diffs.append("the engine's logprobs are not one per token")
    usage, their_usage = ours["usage"], theirs["usage"]
    if list(usage) != list(their_usage):
        diffs.append(f"usage keys {list(usage)} vs {list(their_usage)}")
    if [usage.get(k) for k in COUNTS] != [their_usage.get(k) for k in COUNTS]:
        diffs.append(f"usage counts {usage} vs {their_usage}")
    if usage.get("prompt_tokens_details") != their_usage.get("prompt_tokens_details"):
        diffs.append("usage prompt_tokens_details")
    return diffs, unstreamed


def test_non_streaming_answers_are_the_engines(lane: EngineStack) -> None:
    with lane.openai() as client:
        _check_corpus(lane, client)


def _check_corpus(lane: EngineStack, client: openai.OpenAI) -> None:
    adapter = lane.adapter
    differences: list[str] = []
    seen: dict[str, int] = {}
    unstreamed_total = 0
    for number, case in enumerate(CORPUS):
        body = _body(lane, case)
        # a stream through the gateway: the prompt's first request, and never an error
        streamed = stream_raw(lane.url, gateway_body(body), lane.headers())
        assert streamed.status == 200
        assert streamed.stream.events[-1] == "[DONE]", (case, streamed.stream.events[-1])
        assert lane.receipt(streamed.request_id)["outcome"] in ("complete", "length")
        stream_text = streamed.stream.text()
        entries = sum(1 for c in streamed.stream.chunks if c["choices"][0]["logprobs"] is not None)

        raw = client.chat.completions.with_raw_response.create(**gateway_body(body))
        assert raw.headers["x-usage-source"] == "reported"
        ours = json.loads(raw.http_response.content)
        raw.parse()  # the SDK takes the answer
        theirs = post_json(adapter.base_url, body)

        found, unstreamed = _diffs(ours, theirs, entries)
        unstreamed_total += unstreamed
        differences += [f"case {number} {case}: {d}" for d in found]
        # what the corpus exercised
        choice = theirs["choices"][0]
        content = choice["message"]["content"]
        kinds = {
            "length": choice["finish_reason"] == "length",
            "stop_sequence": "stop_sequence" in choice,
            "stop_without_sequence": choice["finish_reason"] == "stop"
            and "stop_sequence" not in choice,
            "empty": content == "",
            "leading_whitespace_trimmed": stream_text != content
            and stream_text.lstrip(RUST_WHITESPACE) == content
            and content != "",
            "all_whitespace_trimmed": stream_text != "" and content == "",
            "cr_only": stream_text.strip("\r") == "" and stream_text != "",
            "trailing_whitespace": content != content.rstrip(RUST_WHITESPACE),
            "python_whitespace_kept": content[:1] in ("\x1c", "\x1d", "\x1e", "\x1f"),
            "logprobs": choice["logprobs"] is not None,
            "unstreamed_logprobs": unstreamed > 0,
            "max_tokens_256": case.max_tokens == 256,
        }
        for kind, hit in kinds.items():
            seen[kind] = seen.get(kind, 0) + int(hit)
    assert not differences, "\n".join(differences)
    assert all(seen.values()), seen  # every kind of answer above occurred
    assert unstreamed_total > 0
