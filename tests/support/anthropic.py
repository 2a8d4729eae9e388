"""Anthropic Messages streams for tests: :class:`~gateway.apis.messages.events.EventGrammar`
under the gateway's SSE framing, the official SDK's types, and the simulator's
``/v1/messages`` streams captured as bytes.

``AnthropicEvents`` is a :class:`gateway.core.sse.Grammar`: every named
event's JSON goes through ``EventGrammar.feed`` in order, and the stream is
terminated once ``message_stop`` passed, so the framing refuses any byte after
it and calls a body that ends earlier incomplete (``upstream_unavailable``),
as the relay would. A ``ping`` is an item like any other (it carries data).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from typing import Any

import orjson
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from gateway.apis.messages.events import EventGrammar
from gateway.core.errors import GatewayError
from gateway.core.sse import Framing, StreamValidator, violation
from tests.support.sse import drain

EVENTS = TypeAdapter(RawMessageStreamEvent)
MESSAGE = TypeAdapter(Message)


class AnthropicEvents:
    """:class:`EventGrammar` as the framing's grammar; items are ``(name, data)``."""

    def __init__(self) -> None:
        self.rules = EventGrammar()

    @property
    def terminated(self) -> bool:
        return self.rules.state == "stopped"

    def on_event(self, name: str | None, data: str) -> tuple[str, Any]:
        if name is None:
            raise violation("An unnamed event on an Anthropic stream.")
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise violation("An Anthropic event's data is not JSON.") from None
        self.rules.feed(name, obj)
        return name, obj


def validator(framing: Framing | None = None) -> StreamValidator[tuple[str, Any]]:
    return StreamValidator(framing or Framing(), AnthropicEvents())


def replay(
    data: bytes, pieces: Iterable[bytes] | None = None, framing: Framing | None = None
) -> tuple[list[Any], GatewayError | None]:
    """Feed the pieces (or ``data`` whole) then EOF: the events up to ``Done``, and the
    error that ended them, if one did."""
    return drain(validator(framing), pieces if pieces is not None else [data])


def frames(data: bytes) -> list[tuple[str, Any]]:
    """The named events of a gateway-written stream (``event:`` + one ``data:`` line
    each; comments skipped); strict, for the dialect's own output."""
    out: list[tuple[str, Any]] = []
    for block in data.split(b"\n\n"):
        if not block or block.startswith(b":"):
            continue
        head, sep, payload = block.partition(b"\ndata: ")
        assert sep and head.startswith(b"event: ") and b"\n" not in payload, block[:80]
        out.append((head[7:].decode(), json.loads(payload)))
    return out


def check_grammar(events: Iterable[tuple[str, Any]]) -> EventGrammar:
    """Every event fed to a fresh grammar, then its end: raises on the first fault."""
    grammar = EventGrammar()
    for name, data in events:
        grammar.feed(name, data)
    grammar.end()
    return grammar


def check_sdk_types(events: Iterable[tuple[str, Any]]) -> list[Any]:
    """Every event but ``ping`` validated as the SDK's ``RawMessageStreamEvent``."""
    return [EVENTS.validate_python(data) for name, data in events if name != "ping"]


# -- the simulator's /v1/messages over loopback --------------------------------


def post_raw(port: int, path: str, body: dict[str, Any], timeout: float = 5.0) -> bytes:
    """POST ``body`` to 127.0.0.1:``port`` and return the whole response (head and
    body) as the socket delivered it, until the server closes or goes quiet."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    ).encode()
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + payload)
        try:
            while data := sock.recv(65536):
                received += data
        except (TimeoutError, ConnectionResetError):
            pass
    return bytes(received)


def dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response (as much as arrived)."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    out = bytearray()
    while rest:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep or not size_line:
            break
        size = int(size_line, 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out)


def capture(port: int, body: dict[str, Any], timeout: float = 5.0) -> bytes:
    """The SSE body bytes the simulator sends for ``body`` on ``/v1/messages``."""
    return dechunk(post_raw(port, "/v1/messages", {**body, "stream": True}, timeout))


def sim_request(directive: str, **extra: Any) -> dict[str, Any]:
    """A ``/v1/messages`` body for the simulator: one user turn holding ``directive``."""
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": f"{directive} hi"}],
    }
    body.update(extra)
    return body


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}

#: fixtures/sse/messages/*.sse: the request that captures each from a fresh
#: simulator (in this order) and what a replay must find (``expected.json``)
SIM_CAPTURES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "messages_text.sse": (
        sim_request("[[sim chunks=3 unicode=1]]"),
        {
            "result": "ok",
            "events": 8,
            "text": "sim-héllo-0 sim-wörld-1 sim-✓-2 ",
            "thinking": "",
            "stop_reason": "end_turn",
            "output_tokens": 3,
            "tool_use": None,
        },
    ),
    "messages_tool_use.sse": (
        sim_request("[[sim chunks=1 tool_call=1]]", tools=[WEATHER_TOOL]),
        {
            "result": "ok",
            "events": 9,
            "text": "sim-token-0 ",
            "thinking": "",
            "stop_reason": "tool_use",
            "output_tokens": 1,
            "tool_use": {"name": "get_weather", "partial_json": '{"q":1}'},
        },
    ),
    "messages_thinking.sse": (
        sim_request("[[sim chunks=2 reasoning=2]]"),
        {
            "result": "ok",
            "events": 11,
            "text": "sim-token-0 sim-token-1 ",
            "thinking": "sim-thinking-0 sim-thinking-1 ",
            "stop_reason": "end_turn",
            "output_tokens": 4,
            "tool_use": None,
        },
    ),
    "messages_length.sse": (
        sim_request("[[sim chunks=8]]", max_tokens=3),
        {
            "result": "ok",
            "events": 8,
            "text": "sim-token-0 sim-token-1 sim-token-2 ",
            "thinking": "",
            "stop_reason": "max_tokens",
            "output_tokens": 3,
            "tool_use": None,
        },
    ),
    "messages_empty.sse": (
        sim_request("[[sim chunks=0]]"),
        {
            "result": "ok",
            "events": 3,
            "text": "",
            "thinking": "",
            "stop_reason": "end_turn",
            "output_tokens": 0,
            "tool_use": None,
        },
    ),
    "messages_ping.sse": (
        sim_request("[[sim chunks=2 keepalive_ms=20 first_delay_ms=70 delay_ms=50]]"),
        {
            "result": "ok",
            "events": 7,
            "text": "sim-token-0 sim-token-1 ",
            "thinking": "",
            "stop_reason": "end_turn",
            "output_tokens": 2,
            "tool_use": None,
        },
    ),
    "messages_bad_missing_stop.sse": (
        sim_request("[[sim chunks=2 fault=missing_stop]]"),
        {"result": "error", "code": "upstream_unavailable", "outcome": "incomplete", "before": 6},
    ),
    "messages_bad_close_mid.sse": (
        sim_request("[[sim chunks=4 fault=close_mid]]"),
        {"result": "error", "code": "upstream_unavailable", "outcome": "incomplete", "before": 4},
    ),
    "messages_bad_block_order.sse": (
        sim_request("[[sim chunks=2 fault=block_order]]"),
        {
            "result": "error",
            "code": "upstream_protocol_error",
            "outcome": "protocol_error",
            "before": 1,
        },
    ),
    "messages_bad_index_gap.sse": (
        sim_request("[[sim chunks=2 fault=index_gap]]"),
        {
            "result": "error",
            "code": "upstream_protocol_error",
            "outcome": "protocol_error",
            "before": 1,
        },
    ),
    "messages_bad_unknown_event.sse": (
        sim_request("[[sim chunks=2 fault=unknown_event]]"),
        {
            "result": "error",
            "code": "upstream_protocol_error",
            "outcome": "protocol_error",
            "before": 3,
        },
    ),
    "messages_bad_error_event.sse": (
        sim_request("[[sim chunks=2 fault=error_event]]"),
        {
            "result": "error",
            "code": "upstream_protocol_error",
            "outcome": "protocol_error",
            "before": 3,
        },
    ),
    "messages_bad_error_first.sse": (
        sim_request("[[sim chunks=2 fault=error_first]]"),
        {
            "result": "error",
            "code": "upstream_protocol_error",
            "outcome": "protocol_error",
            "before": 0,
        },
    ),
    "messages_bad_after_stop.sse": (
        sim_request("[[sim chunks=2 fault=after_stop]]"),
        {
            "result": "error",
            "code": "upstream_protocol_error",
            "outcome": "protocol_error",
            "before": 7,
        },
    ),
}
