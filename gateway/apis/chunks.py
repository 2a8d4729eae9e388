"""The chat and text-completion chunk dialect (spec §8, §12, §14). Pure.

Grammar (:class:`ChunkGrammar`, over events framed by ``gateway/core/sse.py``;
keep-alives may appear anywhere before ``[DONE]``)::

    data chunk+ -> terminal chunk (finish_reason [+ usage])
      -> [usage-only chunk, choices: []] -> data: [DONE] -> EOF

States: ``START`` (nothing but keep-alives yet) -> ``STREAMING`` (chunks, no
finish_reason) -> ``FINISHED`` (terminal chunk seen) -> ``DONE`` (``[DONE]``
seen, only EOF may follow) -> ``CLOSED``; any failure -> ``ERROR`` (the
validator's one error sink). Classification (spec §12):

* stream-rule violations, bounds included -> ``upstream_protocol_error``;
* the worker's in-band error event (``{"error": ...}``, or a raw-text
  ``data:`` line from releases <= v0.9.2) -> ``upstream_error``, raised at
  once although the worker follows it with ``[DONE]``;
* ``finish_reason: "canceled"`` -> ``upstream_error``, outcome ``canceled``;
* a named event -> violation (chat and completion chunks are unnamed);
* EOF before ``[DONE]`` -> ``upstream_unavailable`` (the framing's rule).

A data payload that fails to parse is the worker's raw-text error unless it
opens like JSON (``{`` or ``[``): then it is a broken chunk, not a message.
U+0000 in text follows ``text_nul`` (spec §14): ``replace`` (default) puts
U+FFFD in its place in the chunk the caller gets and counts it, ``pass``
forwards it, ``reject`` is a violation. Assembled text (content plus
reasoning) is bounded by ``max_text_bytes``.

:class:`ChunkDialect` turns validated chunks into the caller's frames (model
set back to the alias, usage removed unless asked for) or, for a
non-streaming caller, into the answer the worker would have given
non-streamed (:func:`worker_text` is that rule, read in the worker's source:
``mistralrs-core/src/pipeline/sampling.rs`` ``finish_or_add_toks_to_seq``, and
checked against the 0.9.5 engine, ``docs/engine-lane.md``): the text, the
choice's keys in the worker's order, logprobs entries as the non-streaming
path writes them (:func:`answer_logprob`).
"""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.apis.base import OutputText, Plan, Report, StreamBounds, TextNul
from gateway.apis.usage import estimate_output_tokens, usage_count
from gateway.core.errors import GatewayError
from gateway.core.sse import Framing, StreamValidator, violation

__all__ = [
    "Chunk",
    "ChunkDialect",
    "ChunkGrammar",
    "SSEValidator",
    "StreamRules",
    "StreamState",
    "answer_logprob",
    "worker_text",
]

DONE_FRAME = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class StreamRules:
    """What one chat/completion stream may contain; built per request."""

    kind: Literal["chat", "completion"]
    max_tokens: int | None = None
    tools_requested: bool = False
    max_line_bytes: int = 1_048_576
    max_event_bytes: int = 1_048_576
    max_stream_bytes: int = 67_108_864
    max_events: int = 100_000
    max_text_bytes: int = 16_777_216
    text_nul: TextNul = "replace"
    loads: Callable[[bytes | str], Any] = json.loads

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "completion"):
            raise ValueError("kind must be 'chat' or 'completion'")
        if self.text_nul not in ("replace", "pass", "reject"):
            raise ValueError("text_nul must be replace, pass or reject")
        if self.max_text_bytes < 1:
            raise ValueError("stream bounds must be positive")
        self.framing  # noqa: B018 - validates the framing bounds

    @property
    def framing(self) -> Framing:
        return Framing(
            self.max_line_bytes, self.max_event_bytes, self.max_stream_bytes, self.max_events
        )


@dataclass(slots=True)
class Chunk:
    """One validated chunk. ``data`` is the caller's to mutate afterwards."""

    data: dict[str, Any]
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


class StreamState(enum.Enum):
    START = "start"
    STREAMING = "streaming"
    FINISHED = "finished"
    DONE = "done"
    CLOSED = "closed"
    ERROR = "error"


class ChunkGrammar:
    """Chat/completion chunk rules over framed events; see the module docstring."""

    def __init__(self, rules: StreamRules) -> None:
        self._rules = rules
        self._object = "chat.completion.chunk" if rules.kind == "chat" else "text_completion"
        self._finish_reasons = frozenset(
            ("stop", "length", "tool_calls") if rules.tools_requested else ("stop", "length")
        )
        self.state = StreamState.START
        self.text = OutputText(rules.max_text_bytes, rules.text_nul, "chunk")
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunk_id: str | None = None
        self.created: int | None = None
        self.model: str | None = None

    @property
    def terminated(self) -> bool:
        return self.state is StreamState.DONE

    def on_event(self, name: str | None, data: str) -> Chunk | None:
        if name is not None:
            raise violation("Upstream sent a named SSE event.")
        if data == "[DONE]":
            self._on_done()
            return None
        return self._on_payload(data)

    def _on_done(self) -> None:
        if self.state is not StreamState.FINISHED:
            raise violation("Upstream sent [DONE] before a finish_reason.")
        if self._rules.kind == "chat" and self.usage is None:
            raise violation("Upstream chat stream ended without usage.")
        self.state = StreamState.DONE

    def _on_payload(self, data: str) -> Chunk:
        try:
            obj = self._rules.loads(data)
        except RecursionError:
            raise violation("Upstream chunk is nested too deeply.") from None
        except ValueError:
            # from None: the decoder's error holds the document (model output)
            if data.lstrip()[:1] in ("{", "["):
                raise violation("Upstream chunk is not valid JSON.") from None
            if not data:
                raise violation("Upstream sent an empty data event.") from None
            raise GatewayError("upstream_error") from None
        if not isinstance(obj, dict):
            raise violation("Upstream chunk is not a JSON object.")
        if obj.get("error") is not None:
            raise GatewayError("upstream_error")
        return self._on_chunk(obj)

    def _check_identity(self, obj: dict[str, Any]) -> None:
        if obj.get("object") != self._object:
            raise violation("Upstream chunk has the wrong object type.")
        chunk_id, created, model = obj.get("id"), obj.get("created"), obj.get("model")
        if not isinstance(chunk_id, str) or type(created) is not int or not isinstance(model, str):
            raise violation("Upstream chunk lacks a valid id, created or model.")
        if self.chunk_id is None:
            self.chunk_id, self.created, self.model = chunk_id, created, model
            return
        if chunk_id != self.chunk_id:
            raise violation("Upstream chunk id changed within the stream.")
        if created != self.created:
            raise violation("Upstream chunk created changed within the stream.")
        if model != self.model:
            raise violation("Upstream chunk model changed within the stream.")

    def _on_chunk(self, obj: dict[str, Any]) -> Chunk:
        self._check_identity(obj)
        choices = obj.get("choices")
        usage = obj.get("usage")
        if not isinstance(choices, list):
            raise violation("Upstream chunk has no choices list.")
        if usage is not None and not isinstance(usage, dict):
            raise violation("Upstream chunk usage is not an object.")
        if not choices:
            return self._on_usage_only(obj, usage)
        if len(choices) != 1:
            raise violation("Upstream chunk does not have exactly one choice.")
        choice = choices[0]
        if not isinstance(choice, dict) or type(choice.get("index")) is not int:
            raise violation("Upstream chunk choice is malformed.")
        if choice["index"] != 0:
            raise violation("Upstream chunk choice index is not 0.")
        if self.state is StreamState.FINISHED:
            raise violation("Upstream sent a chunk after the finish_reason.")
        text = self._take_text(choice)
        finish = choice.get("finish_reason")
        if finish is None:
            if usage is not None:
                raise violation("Upstream sent usage before the finish_reason.")
            self.state = StreamState.STREAMING
            return Chunk(obj, text, None, None)
        self._on_finish(finish, usage)
        return Chunk(obj, text, finish, usage)

    def _on_usage_only(self, obj: dict[str, Any], usage: dict[str, Any] | None) -> Chunk:
        # OpenAI's include_usage form: the finish chunk had usage null and one
        # choiceless chunk carries it. mistral.rs itself never sends this.
        if self.state is not StreamState.FINISHED or usage is None or self.usage is not None:
            raise violation("Upstream chunk has no choice.")
        self.usage = self._check_usage(usage)
        return Chunk(obj, "", None, usage)

    def _on_finish(self, finish: object, usage: dict[str, Any] | None) -> None:
        if finish == "canceled":
            self.finish_reason = "canceled"
            # keep the worker's usage for the receipt if it is sound; the
            # cancellation, not a usage fault, is the error to report
            if usage is not None:
                with contextlib.suppress(GatewayError):
                    self.usage = self._check_usage(usage)
            raise GatewayError(
                "upstream_error", "The inference worker canceled the request.", outcome="canceled"
            )
        if not isinstance(finish, str) or finish not in self._finish_reasons:
            raise violation("Upstream sent a finish_reason outside the allowed set.")
        if usage is not None:
            self.usage = self._check_usage(usage)
        self.finish_reason = finish
        self.state = StreamState.FINISHED

    def _take_text(self, choice: dict[str, Any]) -> str:
        if self._rules.kind == "chat":
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                raise violation("Upstream chat chunk has no delta object.")
            role = delta.get("role")
            if role is not None and role != "assistant":
                raise violation("Upstream chunk role is not assistant.")
            text = self._text_field(delta, "content")
            self._text_field(delta, "reasoning_content")
            return text
        return self._text_field(choice, "text")

    def _text_field(self, holder: dict[str, Any], key: str) -> str:
        """Validate, count and return one text field ("" when null or absent)."""
        value = holder.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise violation("Upstream chunk text is not a string.")
        if "\x00" in value:
            value = holder[key] = self.text.scrub(value)
        self.text.count(value)
        return value

    def _check_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        prompt = usage_count(usage, "prompt_tokens")
        completion = usage_count(usage, "completion_tokens")
        if prompt + completion != usage_count(usage, "total_tokens"):
            raise violation("Upstream usage does not add up.")
        max_tokens = self._rules.max_tokens
        if max_tokens is not None and completion > max_tokens:
            raise violation("Upstream usage exceeds the request's max_tokens.")
        # a copy: the caller may strip or rewrite usage in the chunk it forwards
        return dict(usage)


class SSEValidator(StreamValidator[Chunk]):
    """A chat/completion stream: WHATWG framing under :class:`ChunkGrammar`."""

    grammar: ChunkGrammar

    def __init__(self, rules: StreamRules) -> None:
        super().__init__(rules.framing, ChunkGrammar(rules))

    @property
    def state(self) -> StreamState:
        if self.error is not None:
            return StreamState.ERROR
        if self.closed:
            return StreamState.CLOSED
        return self.grammar.state

    @property
    def text_bytes(self) -> int:
        return self.grammar.text.bytes

    @property
    def finish_reason(self) -> str | None:
        return self.grammar.finish_reason

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.grammar.usage

    @property
    def chunk_id(self) -> str | None:
        return self.grammar.chunk_id

    @property
    def created(self) -> int | None:
        return self.grammar.created

    @property
    def model(self) -> str | None:
        return self.grammar.model

    @property
    def nul_replaced(self) -> int:
        return self.grammar.text.nul_replaced


# -- the worker's non-streaming text ----------------------------------------

#: Rust's ``char::is_whitespace`` (Unicode White_Space), which ``str::trim_start``
#: uses; Python's ``str.isspace`` differs (it counts U+001C..U+001F).
RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def worker_text(
    streamed: str,
    finish_reason: str | None,
    stops: Sequence[str],
    *,
    tail: int | None = None,
    trimmed: bool = True,
) -> str:
    """The text the worker answers non-streamed, from what it streamed.

    The worker's non-streaming path (``finish_or_add_toks_to_seq``) takes the
    completion up to where a stop string begins and trims leading whitespace
    (``trim_start``, nothing at the end). With a reasoning parser active it
    trims nothing (``trimmed=False``).

    Where the stream stops differs by release. 0.9.5 streams the text before
    the stop string and names it (``stop_sequence``): nothing to cut. Releases
    without ``stop_sequence`` (0.9.2) check stop strings before adding each
    token, so the stream has already carried the stop string and the one
    token decoded after it: cut at the first stop string whose end lies in the
    last ``tail`` characters (the text of the stream's last two content
    chunks; ``None``: anywhere). A ``stop`` finish that was EOS or a stop token
    (a single-token stop string) may hold a requested stop string earlier in
    the text, which the engine did not stop on (one spelled with other tokens,
    or one with U+FFFD matching a replaced invalid byte): that one stays.
    """
    text = streamed
    if finish_reason == "stop" and stops:
        earliest = 0 if tail is None else len(text) - tail
        found = [(text.find(s), s) for s in stops if s]
        cuts = [i for i, s in found if i >= 0 and i + len(s) > earliest]
        if cuts:
            text = text[: min(cuts)]
    return text.lstrip(RUST_WHITESPACE) if trimmed else text


def answer_logprob(entry: Any) -> Any:
    """One streamed logprob entry as the worker's non-streaming answer writes it.

    A chunk's ``bytes`` are the token's raw bytes, cut where the stream's text
    ends (a byte-fallback token is ``[249]``, a token holding the start of a stop
    string only that part); the non-streaming answer writes the UTF-8 of its
    ``token`` text (``[239, 191, 189]`` for U+FFFD, the whole token).
    """
    if not isinstance(entry, dict):
        return entry
    token = entry.get("token")
    if not isinstance(token, str) or not isinstance(entry.get("bytes"), list):
        return entry
    try:
        encoded = token.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: leave the worker's bytes
        return entry
    return {**entry, "bytes": list(encoded)}


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if isinstance(stop, str):
        return [stop]
    return list(stop or [])


class ChunkDialect:
    """One chat or completion answer, for a streaming or a non-streaming caller."""

    terminal_frame = DONE_FRAME

    def __init__(
        self,
        kind: Literal["chat", "completion"],
        plan: Plan,
        bounds: StreamBounds,
        *,
        collect: bool,
    ) -> None:
        framing = bounds.framing
        rules = StreamRules(
            kind=kind,
            max_tokens=plan.max_tokens,
            tools_requested=plan.tools_requested,
            max_line_bytes=framing.max_line_bytes,
            max_event_bytes=framing.max_event_bytes,
            max_stream_bytes=framing.max_stream_bytes,
            max_events=framing.max_events,
            max_text_bytes=bounds.max_text_bytes,
            text_nul=bounds.text_nul,
            loads=orjson.loads,
        )
        self.source = self.validator = SSEValidator(rules)
        self.kind = kind
        # Completion chunks never carry usage (reference §3.5): it is estimated.
        self.usage_source = "reported" if kind == "chat" else "estimated"
        self.alias = plan.alias
        self.include_usage = plan.include_usage
        self.collect = collect
        self.stops = _stops(plan.body)
        self.logprobs_asked = kind == "chat" and plan.body.get("logprobs") is True
        self.has_content = False
        self.content_chunks = 0
        # Only a non-streaming caller needs the text kept: its answer is
        # assembled at the end. A streaming caller needs frames only.
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._logprobs: list[Any] = []
        self._stop_sequence: Any = None

    def on_item(self, chunk: Chunk) -> bytes | None:
        if chunk.text or chunk.finish_reason:
            self.has_content = True
        if chunk.text:
            self.content_chunks += 1
        if self.collect:
            self._note(chunk)
            return None
        data = chunk.data
        data["model"] = self.alias
        if not self.include_usage:
            data.pop("usage", None)
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def error_frame(self, exc: GatewayError) -> bytes:
        return b"data: " + orjson.dumps(exc.body()) + b"\n\n"

    def _note(self, chunk: Chunk) -> None:
        if chunk.text:
            self._text.append(chunk.text)
        choices = chunk.data.get("choices")
        if not choices:
            return
        choice = choices[0]
        logprobs = choice.get("logprobs")
        if logprobs is not None:
            self._logprobs.append(logprobs)
        if "stop_sequence" in choice:
            self._stop_sequence = choice["stop_sequence"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self._reasoning.append(reasoning)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    _merge_tool_call(self._tool_calls, call)

    def report(self) -> Report:
        grammar = self.validator.grammar
        usage = grammar.usage
        counts = None
        if usage is not None:
            counts = (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"])
        return Report(
            finish_reason=grammar.finish_reason,
            usage=usage,
            counts=counts,
            output_estimate=estimate_output_tokens(self.content_chunks, grammar.text.bytes),
            outcome="length" if grammar.finish_reason == "length" else "complete",
            nul_replaced=grammar.text.nul_replaced,
        )

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI JSON object for a non-streaming caller (spec §9, §14), keys
        in the worker's order (``stop_sequence`` after ``finish_reason``)."""
        grammar = self.validator.grammar
        finish = grammar.finish_reason
        named = isinstance(self._stop_sequence, str)
        # A named stop string was not streamed (0.9.5); see worker_text.
        stops = () if named else self.stops
        tail = sum(len(t) for t in self._text[-2:])
        # A reasoning parser on the worker trims nothing (its answer is the parser's).
        text = worker_text(
            "".join(self._text), finish, stops, tail=tail, trimmed=not self._reasoning
        )
        choice: dict[str, Any] = {"finish_reason": finish}
        if self._stop_sequence is not None:
            choice["stop_sequence"] = self._stop_sequence
        choice["index"] = 0
        if self.kind == "completion":
            choice["text"] = text
        else:
            choice["message"] = self._message(text)
        logprobs = [answer_logprob(entry) for entry in self._logprobs]
        # Asked for, the worker answers the object even when the stream carried no
        # entry (e.g. only EOS, whose chunk has none).
        choice["logprobs"] = {"content": logprobs} if logprobs or self.logprobs_asked else None
        return {
            "id": grammar.chunk_id,
            "choices": [choice],
            "created": grammar.created,
            "model": self.alias,
            "system_fingerprint": "local",
            "object": "text_completion" if self.kind == "completion" else "chat.completion",
            "usage": usage,
        }

    def _message(self, text: str) -> dict[str, Any]:
        message: dict[str, Any] = {"content": text, "role": "assistant", "tool_calls": None}
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
            if not text:
                message["content"] = None
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        return message


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", 0)
    if not isinstance(index, int):
        return
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if isinstance(delta.get("id"), str):
        call["id"] = delta["id"]
    function = delta.get("function")
    if isinstance(function, dict):
        if isinstance(function.get("name"), str):
            call["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]
