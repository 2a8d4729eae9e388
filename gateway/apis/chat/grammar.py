"""The chat and text-completion chunk stream grammar (spec §8, §12, §14). Pure.

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

:class:`SSEValidator` is the grammar under the WHATWG framing, what the
dialect (``chunks``) reads the worker's stream with; :data:`DONE_FRAME` is the
``[DONE]`` frame such a stream ends with.
"""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.apis.base import OutputText, TextNul
from gateway.apis.chat.plain import Lazy, plain_text, spliced_text, text_parts, with_text
from gateway.apis.usage import usage_count
from gateway.core.errors import GatewayError
from gateway.core.sse import Framing, StreamValidator, violation

__all__ = [
    "DONE_FRAME",
    "Chunk",
    "ChunkGrammar",
    "SSEValidator",
    "StreamRules",
    "StreamState",
]

DONE_FRAME = b"data: [DONE]\n\n"
#: chunks a turn may parse in full to learn its plain chunk from (plain.py)
_LEARN_TRIES = 4


@dataclass(frozen=True, slots=True)
class StreamRules:
    """What one chat/completion stream may contain; built per request."""

    kind: Literal["chat", "completion"]
    max_tokens: int | None = None
    #: prompt tokens the usage may claim at most (spec §21)
    max_prompt_tokens: int | None = None
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


class Chunk(Lazy):
    """One validated chunk. ``data`` is the caller's to mutate afterwards.

    A plain chunk (:meth:`ChunkGrammar.plain`) is validated on its bytes alone:
    its ``data`` is parsed only when first read (:class:`~.plain.Lazy`), and
    until then :attr:`template` says how its bytes are made, for a dialect to
    splice its frame instead of serializing ``data``.
    """

    __slots__ = ("_template", "finish_reason", "text", "tool_calls", "usage")

    def __init__(
        self,
        data: dict[str, Any] | None,
        text: str,
        finish_reason: str | None,
        usage: dict[str, Any] | None,
        #: the chat delta's ``tool_calls`` as the worker sent them (unchecked), if any:
        #: what the dialect gives the gateway's ids (``apis/ids.py``)
        tool_calls: Any = None,
        *,
        raw: str = "",
        loads: Callable[[bytes | str], Any] | None = None,
        template: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(data, raw, loads)
        self.text = text
        self.finish_reason = finish_reason
        self.usage = usage
        self.tool_calls = tool_calls
        self._template = template

    @property
    def template(self) -> dict[str, Any] | None:
        """A plain chunk's template while nobody has read ``data``: the chunk is
        the template with :attr:`text` as its text (``apis/chat/splice``)."""
        return self._template if self._data is None else None

    def __repr__(self) -> str:
        return (
            f"Chunk(data={self._shown()}, text={self.text!r}, "
            f"finish_reason={self.finish_reason!r}, usage={self.usage!r}, "
            f"tool_calls={self.tool_calls!r})"
        )


class StreamState(enum.Enum):
    START = "start"
    STREAMING = "streaming"
    FINISHED = "finished"
    DONE = "done"
    CLOSED = "closed"
    ERROR = "error"


def _unparsed(data: str) -> GatewayError:
    """A data payload that is not JSON: the worker's raw-text error unless it
    opens like JSON (then it is a broken chunk)."""
    if data.lstrip()[:1] in ("{", "["):
        return violation("Upstream chunk is not valid JSON.")
    if not data:
        return violation("Upstream sent an empty data event.")
    return GatewayError("upstream_error")


class ChunkGrammar:
    """Chat/completion chunk rules over framed events; see the module docstring."""

    def __init__(self, rules: StreamRules) -> None:
        self._rules = rules
        self._chat = rules.kind == "chat"
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
        #: a plain chunk's JSON around its text, and the chunk with "" as text
        #: (``plain.py``), once learned from a chunk checked in full
        self._plain: tuple[str, str] | None = None
        self._template: dict[str, Any] | None = None
        self._learn_left = _LEARN_TRIES

    @property
    def terminated(self) -> bool:
        return self.state is StreamState.DONE

    def new_turn(self) -> None:
        """A new model turn of an agentic stream (after a tool round): the
        worker's chunks may carry a new id and ``created`` from here on."""
        self.chunk_id = self.created = None
        self._plain = self._template = None
        self._learn_left = _LEARN_TRIES

    def on_event(self, name: str | None, data: str) -> Chunk | None:
        if name is not None:
            raise violation("Upstream sent a named SSE event.")
        plain = self._plain
        if plain is not None and self.state is StreamState.STREAMING:
            chunk = self._plain_chunk(data, plain[0], plain[1])
            if chunk is not None:
                return chunk
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
        # A failure is raised outside the handler: the decoder's error holds
        # the document (model output) and must not ride along as the context
        # (``from None`` would do in Python, but not in the compiled build).
        failure: GatewayError | None = None
        try:
            obj = self._rules.loads(data)
        except RecursionError:
            failure = violation("Upstream chunk is nested too deeply.")
        except ValueError:
            failure = _unparsed(data)
        if failure is not None:
            raise failure
        if not isinstance(obj, dict):
            raise violation("Upstream chunk is not a JSON object.")
        if obj.get("error") is not None:
            raise GatewayError("upstream_error")
        chunk = self._on_chunk(obj)
        if (
            self._learn_left > 0
            and self._plain is None
            and self.state is StreamState.STREAMING
            and chunk.tool_calls is None
            and chunk.finish_reason is None
            and (not self._chat or obj["choices"][0]["delta"].get("reasoning_content") is None)
        ):
            self._learn(obj, data, chunk.text)
        return chunk

    def _plain_chunk(self, data: str, head: str, tail: str) -> Chunk | None:
        """The chunk when ``data`` is the learned plain chunk with a
        :func:`plain_text` text: then it is exactly the chunk the template was
        made from with another text, which the full checks would pass (same
        identity, one choice, no finish, usage or tool call), so only its text
        is counted. None: check it in full."""
        text = spliced_text(data, head, tail)
        if text is None:
            return None
        self.text.count(text)
        return Chunk(
            None, text, None, None, raw=data, loads=self._rules.loads, template=self._template
        )

    def _learn(self, obj: dict[str, Any], data: str, text: str) -> None:
        """Learn the plain chunk from ``obj``, a chunk with text and nothing
        else that the full checks passed, when the worker wrote it (``data``)
        exactly as orjson writes it."""
        if not text or not plain_text(text):
            return
        # a worker whose bytes are not orjson's is not asked again and again
        self._learn_left -= 1
        parts = text_parts(with_text(obj, self._chat, ""), self._chat)
        if parts is not None and data == parts[0] + text + parts[1]:
            # The template parsed from its own JSON: ``with_text`` copies only
            # the path to the text, and ``obj`` is its chunk's ``data``, the
            # caller's to edit (an edit in a shared object would be spliced).
            self._plain = parts
            self._template = self._rules.loads(parts[0] + parts[1])

    def _check_identity(self, obj: dict[str, Any]) -> None:
        if (
            # Every chunk after the first: the same identity as the first
            # (its types were checked then; ``type`` because True == 1).
            self.chunk_id is not None
            and obj.get("id") == self.chunk_id
            and type(obj.get("created")) is int
            and obj.get("created") == self.created
            and obj.get("model") == self.model
            and obj.get("object") == self._object
        ):
            return
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
        # Not the first chunk's identity (else the fast check returned): the model.
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
        # a dict once _take_text passed a chat chunk
        calls = choice["delta"].get("tool_calls") if self._chat else None
        finish = choice.get("finish_reason")
        if finish is None:
            if usage is not None:
                raise violation("Upstream sent usage before the finish_reason.")
            self.state = StreamState.STREAMING
            return Chunk(obj, text, None, None, calls)
        self._on_finish(finish, usage)
        return Chunk(obj, text, finish, usage, calls)

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
        bound = self._rules.max_prompt_tokens
        if bound is not None and prompt > bound:
            raise violation("Upstream usage claims more prompt tokens than were sent.")
        # a copy: the caller may strip or rewrite usage in the chunk it forwards
        return dict(usage)


class SSEValidator(StreamValidator[Chunk]):
    """A chat/completion stream: WHATWG framing under :class:`ChunkGrammar`."""

    def __init__(self, rules: StreamRules) -> None:
        chunks = ChunkGrammar(rules)
        super().__init__(rules.framing, chunks)
        self._chunks = chunks

    @property
    def grammar(self) -> ChunkGrammar:
        return self._chunks

    @property
    def chunks(self) -> ChunkGrammar:
        return self._chunks

    @property
    def state(self) -> StreamState:
        if self.error is not None:
            return StreamState.ERROR
        if self.closed:
            return StreamState.CLOSED
        return self._chunks.state

    @property
    def text_bytes(self) -> int:
        return self._chunks.text.bytes

    @property
    def finish_reason(self) -> str | None:
        return self._chunks.finish_reason

    @property
    def usage(self) -> dict[str, Any] | None:
        return self._chunks.usage

    @property
    def chunk_id(self) -> str | None:
        return self._chunks.chunk_id

    @property
    def created(self) -> int | None:
        return self._chunks.created

    @property
    def model(self) -> str | None:
        return self._chunks.model

    @property
    def nul_replaced(self) -> int:
        return self._chunks.text.nul_replaced
