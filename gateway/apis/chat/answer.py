"""A non-streaming caller's chat or completion answer, from the chunks (spec §9, §14). Pure.

:class:`CollectedAnswer` notes what the validated chunks carried and builds
the answer the worker would have given non-streamed (:func:`worker_text` is
that rule, read in the worker's source:
``mistralrs-core/src/pipeline/sampling.rs`` ``finish_or_add_toks_to_seq``, and
checked against the 0.9.5 engine, ``docs/engine-lane.md``): the text, the
choice's keys in the worker's order, logprobs entries as the non-streaming
path writes them (:func:`answer_logprob`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from gateway.apis.chat.grammar import Chunk, ChunkGrammar

__all__ = [
    "RUST_WHITESPACE",
    "CollectedAnswer",
    "answer_logprob",
    "worker_text",
]

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


class CollectedAnswer:
    """What a non-streaming caller's answer is assembled from, noted chunk by chunk."""

    def __init__(
        self, kind: Literal["chat", "completion"], alias: str, body: dict[str, Any]
    ) -> None:
        self.kind = kind
        self.alias = alias
        self.stops = _stops(body)
        self.logprobs_asked = kind == "chat" and body.get("logprobs") is True
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._logprobs: list[Any] = []
        self._stop_sequence: Any = None

    def note(self, chunk: Chunk) -> None:
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

    def answer(self, grammar: ChunkGrammar, usage: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI JSON object for a non-streaming caller (spec §9, §14), keys
        in the worker's order (``stop_sequence`` after ``finish_reason``)."""
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
