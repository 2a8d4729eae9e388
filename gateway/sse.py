"""Sans-I/O validator for the worker's chat/completion SSE streams (spec §8, §12).

Theory of operation
-------------------

The validator owns no socket. The caller feeds it the worker's body bytes
exactly as they arrive with :meth:`SSEValidator.receive_data` (``b""`` means
the body ended), then calls :meth:`SSEValidator.next_event` until it returns
:data:`NEED_DATA`. Each call yields at most one event:

* :class:`KeepAlive` -- an event with no ``data:`` line (the worker's ``:\\n\\n``
  comment). Forward it as ``b":\\n\\n"``; it also resets the idle timer.
* :class:`Chunk` -- one validated chunk, parsed.
* :class:`Done` -- ``data: [DONE]`` arrived *and then* the body ended with no
  further byte. Only then may the caller send its own ``[DONE]``: a stream is
  valid end to end or not at all.

Results depend only on the bytes, never on how they were split: lines are
cut at LF, CRLF or CR (a CR that ends one feed and an LF that starts the next
form one line end), decoded as strict UTF-8 only once complete, so a split
inside a multi-byte character is harmless.

Accepted grammar (keep-alives may appear anywhere before ``[DONE]``, because
the worker sends one after every 10 s of silence, prefill included)::

    data chunk+ -> terminal chunk (finish_reason [+ usage])
      -> [usage-only chunk, choices: []] -> data: [DONE] -> EOF

States: ``START`` (nothing but keep-alives yet) -> ``STREAMING`` (chunks, no
finish_reason) -> ``FINISHED`` (terminal chunk seen) -> ``DONE`` (``[DONE]``
seen, only EOF may follow) -> ``CLOSED`` (:class:`Done` returned). Any failure
moves to ``ERROR``, from which every later :meth:`~SSEValidator.next_event`
re-raises the same :class:`~gateway.errors.GatewayError` -- the one error
sink. Classification (spec §12):

* stream-rule violations, bounds included -> ``upstream_protocol_error``;
* the worker's in-band error event (``{"error": ...}``, or a raw-text
  ``data:`` line from releases <= v0.9.2) -> ``upstream_error``, raised at
  once although the worker follows it with ``[DONE]``;
* ``finish_reason: "canceled"`` -> ``upstream_error``, outcome ``canceled``;
* EOF before ``[DONE]``, mid-line included -> ``upstream_unavailable``,
  outcome ``incomplete``.

A data payload that fails to parse is the worker's raw-text error unless it
opens like JSON (``{`` or ``[``): then it is a broken chunk, not a message.

Bounds (:class:`StreamRules`): bytes past ``max_stream_bytes`` are never
buffered; the partial line is checked against the line and event bounds as
it grows; events (keep-alives and ``[DONE]`` included) and assembled text
(content plus reasoning) are counted as they are produced. A bound is
reported at the position where it was crossed, after every event before it.

Error messages are fixed texts: stream content is model output and never
goes into them (nor into their ``__cause__``).
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from gateway.errors import GatewayError

__all__ = [
    "NEED_DATA",
    "Chunk",
    "Done",
    "KeepAlive",
    "NeedData",
    "SSEValidator",
    "StreamRules",
    "StreamState",
]

_EOL: Final = re.compile(rb"[\r\n]")
_CR: Final = 0x0D
_LF: Final = 0x0A


@dataclass(frozen=True, slots=True)
class StreamRules:
    """What one stream may contain; built per request by the caller."""

    kind: Literal["chat", "completion"]
    max_tokens: int | None = None
    tools_requested: bool = False
    max_line_bytes: int = 1_048_576
    max_event_bytes: int = 1_048_576
    max_stream_bytes: int = 67_108_864
    max_events: int = 100_000
    max_text_bytes: int = 16_777_216
    loads: Callable[[bytes | str], Any] = json.loads

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "completion"):
            raise ValueError("kind must be 'chat' or 'completion'")
        bounds = (
            self.max_line_bytes,
            self.max_event_bytes,
            self.max_stream_bytes,
            self.max_events,
            self.max_text_bytes,
        )
        if min(bounds) < 1:
            raise ValueError("stream bounds must be positive")


@dataclass(slots=True)
class KeepAlive:
    """An event without data (a comment); forward as ``b":\\n\\n"``."""


@dataclass(slots=True)
class Chunk:
    """One validated chunk. ``data`` is the caller's to mutate afterwards."""

    data: dict[str, Any]
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


@dataclass(slots=True)
class Done:
    """``[DONE]`` arrived and the body then ended cleanly."""


class NeedData(enum.Enum):
    """Type of the :data:`NEED_DATA` sentinel (an enum so ``is`` narrows it)."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


class StreamState(enum.Enum):
    START = "start"
    STREAMING = "streaming"
    FINISHED = "finished"
    DONE = "done"
    CLOSED = "closed"
    ERROR = "error"


def _violation(message: str) -> GatewayError:
    return GatewayError("upstream_protocol_error", message, outcome="protocol_error")


def _upstream_error() -> GatewayError:
    return GatewayError(
        "upstream_error", "The inference worker reported an error.", outcome="upstream_error"
    )


def _count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    # bool is an int subclass; a JSON true is not a token count
    if type(value) is not int or value < 0:
        raise _violation("Upstream usage counts are not non-negative integers.")
    return value


class SSEValidator:
    """Validates one worker stream; see the module docstring."""

    def __init__(self, rules: StreamRules) -> None:
        self._rules = rules
        self._object = "chat.completion.chunk" if rules.kind == "chat" else "text_completion"
        self._finish_reasons = frozenset(
            ("stop", "length", "tool_calls") if rules.tools_requested else ("stop", "length")
        )
        self._state = StreamState.START
        self._error: GatewayError | None = None
        self._buf = bytearray()
        self._pos = 0
        self._skip_lf = False
        self._first_line = True
        self._eof = False
        self._overflow = False
        self._bytes_received = 0
        # the event being assembled
        self._event_open = False
        self._event_bytes = 0
        self._data: list[str] = []
        self._events = 0
        self._text_bytes = 0
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._chunk_id: str | None = None
        self._created: int | None = None
        self._model: str | None = None

    # -- read-only view for receipts and assembly ---------------------------

    @property
    def state(self) -> StreamState:
        return self._state

    @property
    def events(self) -> int:
        return self._events

    @property
    def bytes_received(self) -> int:
        return self._bytes_received

    @property
    def pending_bytes(self) -> int:
        """Bytes held for a line or an event not yet complete.

        Once :meth:`next_event` has returned :data:`NEED_DATA` this is at most
        ``max_line_bytes + max_event_bytes``, whatever the worker sent.
        """
        return len(self._buf) - self._pos + self._event_bytes

    @property
    def text_bytes(self) -> int:
        return self._text_bytes

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason

    @property
    def usage(self) -> dict[str, Any] | None:
        return self._usage

    @property
    def chunk_id(self) -> str | None:
        return self._chunk_id

    @property
    def created(self) -> int | None:
        return self._created

    @property
    def model(self) -> str | None:
        return self._model

    # -- input ----------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Buffer ``data``; ``b""`` marks the end of the body."""
        if self._state is StreamState.ERROR:
            return
        if self._eof:
            if data:
                raise RuntimeError("receive_data() called after EOF")
            return
        if not data:
            self._eof = True
            return
        before = self._bytes_received
        self._bytes_received += len(data)
        limit = self._rules.max_stream_bytes
        if self._bytes_received > limit:
            # keep what fits so the events before the bound still come out
            self._overflow = True
            data = data[: max(0, limit - before)]
        self._buf += data

    # -- output ---------------------------------------------------------------

    def next_event(self) -> KeepAlive | Chunk | Done | NeedData:
        """The next event, :data:`NEED_DATA`, or a :class:`GatewayError`."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        try:
            return self._next_event()
        except GatewayError as exc:
            self._state = StreamState.ERROR
            self._error = exc
            self._buf.clear()
            self._data.clear()
            raise

    def _next_event(self) -> KeepAlive | Chunk | Done | NeedData:
        while True:
            if self._state is StreamState.DONE or self._state is StreamState.CLOSED:
                return self._after_done()
            line = self._next_line()
            if line is None:
                return self._starved()
            event = self._on_line(line)
            if event is not None:
                return event

    def _starved(self) -> NeedData:
        """No complete line is buffered: check what is pending, then wait."""
        self._check_line_length(len(self._buf) - self._pos)
        if self._overflow:
            raise _violation("Upstream stream exceeded the total size limit.")
        if self._eof:
            raise GatewayError(
                "upstream_unavailable",
                "The inference worker closed the stream before [DONE].",
                outcome="incomplete",
            )
        del self._buf[: self._pos]
        self._pos = 0
        return NEED_DATA

    def _after_done(self) -> Done | NeedData:
        self._consume_lf()
        if self._pos < len(self._buf):
            raise _violation("Upstream sent data after [DONE].")
        if self._overflow:
            raise _violation("Upstream stream exceeded the total size limit.")
        if not self._eof:
            self._buf.clear()
            self._pos = 0
            return NEED_DATA
        self._state = StreamState.CLOSED
        return Done()

    # -- framing (WHATWG) -------------------------------------------------------

    def _consume_lf(self) -> None:
        """Drop the LF of a CRLF whose CR ended the previous line."""
        if self._skip_lf and self._pos < len(self._buf):
            self._skip_lf = False
            if self._buf[self._pos] == _LF:
                self._pos += 1

    def _check_line_length(self, n: int) -> None:
        # Whichever bound a growing line crosses first is reported, so a line
        # seen whole and one seen byte by byte fail alike.
        max_line = self._rules.max_line_bytes
        room = self._rules.max_event_bytes - self._event_bytes
        if n > min(max_line, room):
            if max_line <= room:
                raise _violation("Upstream SSE line exceeded the size limit.")
            raise _violation("Upstream SSE event exceeded the size limit.")

    def _next_line(self) -> str | None:
        self._consume_lf()
        buf, start = self._buf, self._pos
        match = _EOL.search(buf, start)
        if match is None:
            return None
        end = match.start()
        self._check_line_length(end - start)
        self._pos = end + 1
        if buf[end] == _CR:
            self._skip_lf = True
        try:
            line = buf[start:end].decode("utf-8")
        except UnicodeDecodeError:
            # from None: the decode error carries the raw bytes (model output)
            raise _violation("Upstream stream is not valid UTF-8.") from None
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        self._event_bytes += end - start
        return line

    def _on_line(self, line: str) -> KeepAlive | Chunk | None:
        if not line:
            return self._dispatch()
        self._event_open = True
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event" and value:
            raise _violation("Upstream sent a named SSE event.")
        # id:, retry: and unknown fields carry nothing the gateway forwards
        return None

    def _dispatch(self) -> KeepAlive | Chunk | None:
        if not self._event_open:
            return None
        self._event_open = False
        self._event_bytes = 0
        self._events += 1
        if self._events > self._rules.max_events:
            raise _violation("Upstream stream exceeded the event count limit.")
        if not self._data:
            return KeepAlive()
        data = "\n".join(self._data)
        self._data.clear()
        if data == "[DONE]":
            self._on_done()
            return None
        return self._on_payload(data)

    # -- chunk rules ----------------------------------------------------------

    def _on_done(self) -> None:
        if self._state is not StreamState.FINISHED:
            raise _violation("Upstream sent [DONE] before a finish_reason.")
        if self._rules.kind == "chat" and self._usage is None:
            raise _violation("Upstream chat stream ended without usage.")
        self._state = StreamState.DONE

    def _on_payload(self, data: str) -> Chunk:
        try:
            obj = self._rules.loads(data)
        except RecursionError:
            raise _violation("Upstream chunk is nested too deeply.") from None
        except ValueError:
            # from None: the decoder's error holds the document (model output)
            if data.lstrip()[:1] in ("{", "["):
                raise _violation("Upstream chunk is not valid JSON.") from None
            if not data:
                raise _violation("Upstream sent an empty data event.") from None
            raise _upstream_error() from None
        if not isinstance(obj, dict):
            raise _violation("Upstream chunk is not a JSON object.")
        if obj.get("error") is not None:
            raise _upstream_error()
        return self._on_chunk(obj)

    def _check_identity(self, obj: dict[str, Any]) -> None:
        if obj.get("object") != self._object:
            raise _violation("Upstream chunk has the wrong object type.")
        chunk_id, created, model = obj.get("id"), obj.get("created"), obj.get("model")
        if not isinstance(chunk_id, str) or type(created) is not int or not isinstance(model, str):
            raise _violation("Upstream chunk lacks a valid id, created or model.")
        if self._chunk_id is None:
            self._chunk_id, self._created, self._model = chunk_id, created, model
            return
        if chunk_id != self._chunk_id:
            raise _violation("Upstream chunk id changed within the stream.")
        if created != self._created:
            raise _violation("Upstream chunk created changed within the stream.")
        if model != self._model:
            raise _violation("Upstream chunk model changed within the stream.")

    def _on_chunk(self, obj: dict[str, Any]) -> Chunk:
        self._check_identity(obj)
        choices = obj.get("choices")
        usage = obj.get("usage")
        if not isinstance(choices, list):
            raise _violation("Upstream chunk has no choices list.")
        if usage is not None and not isinstance(usage, dict):
            raise _violation("Upstream chunk usage is not an object.")
        if not choices:
            return self._on_usage_only(obj, usage)
        if len(choices) != 1:
            raise _violation("Upstream chunk does not have exactly one choice.")
        choice = choices[0]
        if not isinstance(choice, dict) or type(choice.get("index")) is not int:
            raise _violation("Upstream chunk choice is malformed.")
        if choice["index"] != 0:
            raise _violation("Upstream chunk choice index is not 0.")
        if self._state is StreamState.FINISHED:
            raise _violation("Upstream sent a chunk after the finish_reason.")
        text = self._take_text(choice)
        finish = choice.get("finish_reason")
        if finish is None:
            if usage is not None:
                raise _violation("Upstream sent usage before the finish_reason.")
            self._state = StreamState.STREAMING
            return Chunk(obj, text, None, None)
        self._on_finish(finish, usage)
        return Chunk(obj, text, finish, usage)

    def _on_usage_only(self, obj: dict[str, Any], usage: dict[str, Any] | None) -> Chunk:
        # OpenAI's include_usage form: the finish chunk had usage null and one
        # choiceless chunk carries it. mistral.rs itself never sends this.
        if self._state is not StreamState.FINISHED or usage is None or self._usage is not None:
            raise _violation("Upstream chunk has no choice.")
        self._usage = self._check_usage(usage)
        return Chunk(obj, "", None, usage)

    def _on_finish(self, finish: object, usage: dict[str, Any] | None) -> None:
        if finish == "canceled":
            self._finish_reason = "canceled"
            # keep the worker's usage for the receipt if it is sound; the
            # cancellation, not a usage fault, is the error to report
            if usage is not None:
                with contextlib.suppress(GatewayError):
                    self._usage = self._check_usage(usage)
            raise GatewayError(
                "upstream_error", "The inference worker canceled the request.", outcome="canceled"
            )
        if not isinstance(finish, str) or finish not in self._finish_reasons:
            raise _violation("Upstream sent a finish_reason outside the allowed set.")
        if usage is not None:
            self._usage = self._check_usage(usage)
        self._finish_reason = finish
        self._state = StreamState.FINISHED

    def _take_text(self, choice: dict[str, Any]) -> str:
        if self._rules.kind == "chat":
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                raise _violation("Upstream chat chunk has no delta object.")
            role = delta.get("role")
            if role is not None and role != "assistant":
                raise _violation("Upstream chunk role is not assistant.")
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
            raise _violation("Upstream chunk text is not a string.")
        if "\x00" in value:
            raise _violation("Upstream chunk text contains NUL.")
        if value.isascii():
            size = len(value)
        else:
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                # a lone surrogate escape (\ud800) decodes but cannot be re-sent
                raise _violation("Upstream chunk text is not valid Unicode.") from None
        self._text_bytes += size
        if self._text_bytes > self._rules.max_text_bytes:
            raise _violation("Upstream stream exceeded the text size limit.")
        return value

    def _check_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        prompt = _count(usage, "prompt_tokens")
        completion = _count(usage, "completion_tokens")
        if prompt + completion != _count(usage, "total_tokens"):
            raise _violation("Upstream usage does not add up.")
        max_tokens = self._rules.max_tokens
        if max_tokens is not None and completion > max_tokens:
            raise _violation("Upstream usage exceeds the request's max_tokens.")
        # a copy: the caller may strip or rewrite usage in the chunk it forwards
        return dict(usage)
