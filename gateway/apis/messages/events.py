"""The Anthropic Messages dialect (spec §19): the worker's chat chunks, validated
by chat's grammar, as Anthropic events or the Anthropic answer. Pure.

A stream is ``message_start`` (first, once), then per content block in index
order from 0 ``content_block_start``, its deltas (``text_delta`` on text,
``thinking_delta`` on thinking, ``input_json_delta`` on tool_use) and
``content_block_stop``, then ``message_delta`` (once: ``stop_reason`` and the
worker's reported usage) and ``message_stop`` (last); the body then ends (no
``[DONE]``). A block opens when a chunk carries a delta of another kind than
the open one; ``message_delta`` waits for the worker's usage chunk, so it is
the stream's terminal frame. A failure ends the stream with one ``event:
error`` and no ``message_stop``. :class:`EventGrammar` checks exactly these
rules on any Anthropic stream (what the gateway emits, and the worker's own).

The answer is what the worker's own non-streamed ``/v1/messages`` builds:
``stop_reason`` from ``finish_reason`` (``stop`` -> ``end_turn``, ``length`` ->
``max_tokens``, ``tool_calls`` -> ``tool_use``, a matched stop string ->
``stop_sequence``), a tool call's input parsed from its arguments (or
``{"arguments": "<raw>"}`` when they do not parse), the alias as ``model``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import orjson

from gateway.apis.base import OneCall, Plan, Report, StreamBounds
from gateway.apis.chat.dialect import ChunkDialect
from gateway.apis.chat.grammar import Chunk
from gateway.apis.held import JsonBody
from gateway.apis.ids import gateway_id
from gateway.core.errors import GatewayError
from gateway.core.sse import violation

_STOP_REASONS = {"stop": "end_turn", "eos": "end_turn", "length": "max_tokens"}
#: every stop_reason an Anthropic stream may end with
_STOP_REASON_VALUES = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", None}
)


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    if stop_sequence is not None:
        return "stop_sequence"
    if finish_reason == "tool_calls":
        return "tool_use"
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode("ascii") + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def message_id() -> str:
    """The gateway's own id (spec §21): random per request, never the worker's."""
    return gateway_id("msg_")


def tool_input(arguments: str) -> Any:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


class MessagesDialect(OneCall):
    """One chat answer from the worker, for an Anthropic caller."""

    def __init__(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> None:
        # Chat's dialect reads and checks the worker's stream (and keeps a
        # non-streaming caller's answer); this one only shows it the Anthropic way.
        # Chat's answer cuts at chat's ``stop``: give it the message's stop_sequences.
        stops = {"stop": plan.body.get("stop_sequences") or []}
        # Its tool calls' ids are the gateway's as Anthropic spells them (spec §24).
        self.chat = ChunkDialect(
            "chat",
            dataclasses.replace(plan, body=stops),
            bounds,
            collect=collect,
            call_prefix="toolu_",
        )
        self._terminal: bytes | None = None
        self.alias = plan.alias
        self.collect = collect
        self.id = message_id()
        self.usage_source = "reported"
        self._started = False
        #: the open block: (index, kind, tool call index) or None
        self._open: tuple[int, str, int | None] | None = None
        self._next_index = 0
        self._tool_blocks: dict[int, int] = {}
        self._stop_sequence: str | None = None

    @property
    def source(self) -> Any:
        return self.chat.source

    @property
    def has_content(self) -> bool:
        return self.chat.has_content

    def on_item(self, chunk: Chunk) -> bytes | None:
        self.chat.observe(chunk)
        choices = chunk.data.get("choices")
        choice = choices[0] if choices else None
        if choice is not None and isinstance(choice.get("stop_sequence"), str):
            self._stop_sequence = choice["stop_sequence"]
        if self.collect:
            return None
        out: list[bytes] = []
        if not self._started:
            self._started = True
            out.append(event("message_start", {"type": "message_start", "message": self._head()}))
        delta = choice.get("delta") if choice is not None else None
        if isinstance(delta, dict):
            reasoning = delta.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                self._delta(
                    out, "thinking", None, {"type": "thinking_delta", "thinking": reasoning}
                )
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._delta(out, "text", None, {"type": "text_delta", "text": content})
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    self._tool_delta(out, call)
        if choice is not None and choice.get("finish_reason") is not None:
            self._close(out)
        return b"".join(out) or None

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.alias,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # The counts come with message_delta, once the worker reported them.
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }

    def _delta(self, out: list[bytes], kind: str, call: int | None, delta: dict[str, Any]) -> None:
        opened = self._open
        if opened is None or opened[1] != kind or opened[2] != call:
            self._close(out)
            index = self._next_index
            self._next_index += 1
            self._open = (index, kind, call)
            block: dict[str, Any] = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            out.append(self._start(index, block))
        assert self._open is not None
        out.append(self._block_delta(self._open[0], delta))

    def _tool_delta(self, out: list[bytes], call: Any) -> None:
        if not isinstance(call, dict):
            return
        number = call.get("index", 0)
        if not isinstance(number, int):
            # The grammar leaves tool calls unchecked. The answer drops a call
            # without an integer index (chat's ``_merge_tool_call``), so the
            # stream does too; compiled, such a value in ``_open`` would also
            # be a TypeError, not a frame.
            return
        found = call.get("function")
        function: dict[str, Any] = found if isinstance(found, dict) else {}
        opened = self._open
        if opened is None or opened[1] != "tool_use" or opened[2] != number:
            self._close(out)
            index = self._next_index
            self._next_index += 1
            self._open = (index, "tool_use", number)
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or self._tool_id(number),
                "name": function.get("name") or "",
                "input": {},
            }
            out.append(self._start(index, block))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            partial = {"type": "input_json_delta", "partial_json": arguments}
            out.append(self._block_delta(self._open[0] if self._open else 0, partial))

    def _tool_id(self, number: Any) -> str:
        """A tool use's id when the worker gave its call none (stream and answer alike)."""
        return f"toolu_{self.id[4:]}_{number}"

    @staticmethod
    def _start(index: int, block: dict[str, Any]) -> bytes:
        return event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )

    @staticmethod
    def _block_delta(index: int, delta: dict[str, Any]) -> bytes:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            index = self._open[0]
            self._open = None
            out.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))

    @property
    def terminal_frame(self) -> bytes:
        """``message_delta`` with the worker's usage, then ``message_stop``
        (made once: the stream's end is one end)."""
        if self._terminal is None:
            self._terminal = self._end()
        return self._terminal

    def _end(self) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            out.append(event("message_start", {"type": "message_start", "message": self._head()}))
        self._close(out)
        grammar = self.chat.validator.chunks
        usage = grammar.usage or {}
        out.append(
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": stop_reason(grammar.finish_reason, self._stop_sequence),
                        "stop_sequence": self._stop_sequence,
                    },
                    "usage": {
                        "input_tokens": usage.get("prompt_tokens", 0),
                        "output_tokens": usage.get("completion_tokens", 0),
                    },
                },
            )
        )
        out.append(event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def error_frame(self, exc: GatewayError) -> bytes:
        body = exc.anthropic_body()
        body["error"]["type"] = "api_error"
        return event("error", body)

    def report(self) -> Report:
        return self.chat.report()

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        chat = self.chat.answer(usage)
        choice = chat["choices"][0]
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        text = message.get("content")
        if isinstance(text, str) and text:
            content.append({"type": "text", "text": text})
        for number, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id") or self._tool_id(number),
                    "name": function.get("name") or "",
                    "input": tool_input(function.get("arguments") or ""),
                }
            )
        stop = choice.get("stop_sequence") if isinstance(choice.get("stop_sequence"), str) else None
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.alias,
            "content": content,
            "stop_reason": stop_reason(choice.get("finish_reason"), stop),
            "stop_sequence": stop,
            "usage": {
                "input_tokens": usage.get("prompt_tokens", 0),
                "output_tokens": usage.get("completion_tokens", 0),
            },
        }


class CountTokensDialect(OneCall):
    """The worker's ``{"input_tokens": n}``, checked; nothing is generated."""

    terminal_frame = b""
    usage_source = "reported"

    def __init__(self, plan: Plan, bounds: StreamBounds) -> None:
        self._source = JsonBody(bounds.framing.max_line_bytes, orjson.loads)
        self.has_content = False
        self._tokens: int | None = None

    @property
    def source(self) -> JsonBody:
        return self._source

    def on_item(self, answer: Any) -> bytes | None:
        if not isinstance(answer, dict) or set(answer) != {"input_tokens"}:
            raise violation("Upstream count_tokens answer is malformed.")
        tokens = answer["input_tokens"]
        if type(tokens) is not int or tokens < 0:
            raise violation("Upstream count_tokens answer is malformed.")
        self._tokens = tokens
        self.has_content = True
        return None

    def error_frame(self, exc: GatewayError) -> bytes:
        raise AssertionError("a token count is never streamed")

    def report(self) -> Report:
        tokens = self._tokens
        counts = (tokens, 0, tokens) if tokens is not None else None
        return Report(counts=counts, outcome="complete")

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        assert self._tokens is not None
        return {"input_tokens": self._tokens}


#: the delta type each content block kind takes
_DELTAS = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}


class EventGrammar:
    """The Anthropic stream's order (module docstring), event by event.

    ``feed(name, data)`` raises the grammar's ``upstream_protocol_error`` on
    the first event out of order; ``end()`` on a stream that ended early.
    Unknown and agentic events (``agentic_tool_call_progress`` …) fail closed.
    """

    def __init__(self) -> None:
        self.state = "start"
        self.open: tuple[int, str] | None = None
        self.next_index = 0
        handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "message_start": self._message_start,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
            "message_stop": self._message_stop,
        }
        self._handlers = handlers

    def feed(self, name: str, data: Any) -> None:
        if not isinstance(data, dict) or data.get("type") != name:
            raise violation(f"Anthropic event {name!r} does not carry its own type.")
        if name == "ping":
            if self.state == "stopped":
                raise violation("An event after message_stop.")
            return
        handler = self._handlers.get(name)
        if handler is None:
            raise violation("An unknown Anthropic event.")
        if self.state == "stopped":
            raise violation("An event after message_stop.")
        handler(data)

    def end(self) -> None:
        if self.state != "stopped":
            raise violation("The Anthropic stream ended before message_stop.")

    def _message_start(self, data: dict[str, Any]) -> None:
        message = data.get("message")
        if self.state != "start" or not isinstance(message, dict):
            raise violation("message_start must come first, once.")
        if message.get("type") != "message" or message.get("role") != "assistant":
            raise violation("message_start does not start an assistant message.")
        self.state = "blocks"

    def _block_start(self, data: dict[str, Any]) -> None:
        block = data.get("content_block")
        if self.state != "blocks" or self.open is not None:
            raise violation("content_block_start outside the blocks or inside another block.")
        if data.get("index") != self.next_index or not isinstance(block, dict):
            raise violation("content_block_start out of index order.")
        kind = block.get("type")
        if not isinstance(kind, str) or kind not in _DELTAS:
            raise violation("An unknown content block type.")
        self.open = (self.next_index, kind)
        self.next_index += 1

    def _block_delta(self, data: dict[str, Any]) -> None:
        delta = data.get("delta")
        if self.open is None or data.get("index") != self.open[0] or not isinstance(delta, dict):
            raise violation("content_block_delta outside its open block.")
        expected = _DELTAS[self.open[1]]
        kind = delta.get("type")
        if kind != expected and not (self.open[1] == "thinking" and kind == "signature_delta"):
            raise violation("A content block delta of the wrong kind.")

    def _block_stop(self, data: dict[str, Any]) -> None:
        if self.open is None or data.get("index") != self.open[0]:
            raise violation("content_block_stop without its open block.")
        self.open = None

    def _message_delta(self, data: dict[str, Any]) -> None:
        if self.state != "blocks" or self.open is not None:
            raise violation("message_delta inside a block, or twice.")
        delta, usage = data.get("delta"), data.get("usage")
        if not isinstance(delta, dict) or not isinstance(usage, dict):
            raise violation("message_delta without its delta and usage.")
        tokens = usage.get("output_tokens")
        if type(tokens) is not int or tokens < 0:
            raise violation("message_delta usage is malformed.")
        reason = delta.get("stop_reason")
        if not (reason is None or isinstance(reason, str)) or reason not in _STOP_REASON_VALUES:
            raise violation("message_delta carries an unknown stop_reason.")
        self.state = "delta"

    def _message_stop(self, data: dict[str, Any]) -> None:
        if self.state != "delta":
            raise violation("message_stop before message_delta.")
        self.state = "stopped"
