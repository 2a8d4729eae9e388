"""The relay without a socket: a fake worker stream through the real chat dialect.

Frames, headers and the terminator as the caller gets them (whole, byte by
byte, at random splits), the one error frame after headers, the deadlines
(first event, idle, total) and a caller that stops reading, the collected
answer, ``close`` and the stream's digest."""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Any, cast

import orjson
import pytest

from gateway.apis.base import KEEPALIVE_FRAME, Dialect, Plan, Report, StreamBounds
from gateway.apis.chat.api import ChatApi
from gateway.apis.usage import counts_only
from gateway.core.errors import ErrorCode, GatewayError
from gateway.core.sse import NEED_DATA, NeedData
from gateway.pipeline.cancel import CallerStalled
from gateway.pipeline.relay import Relay, Timeouts
from gateway.upstream.client import UpstreamStream
from tests.pipeline.support import ALIAS, Caller, FakeUpstream, chat_plan, sse_fixture
from tests.support.poll import eventually_async
from tests.support.sse import chunk, event, usage

HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"x-test", b"1")]
SLOW = Timeouts(5, 5, 5)
DONE = b"data: [DONE]\n\n"
VALID = sse_fixture("chat_valid.sse")
VALID_TEXT = "Héllo, wörld — 日本語 🙂!"


def _relay(
    plan: Plan | None = None,
    *,
    collect: bool = False,
    timeouts: Timeouts = SLOW,
    abort: Any = None,
    body_writer: Any = None,
) -> Relay:
    dialect = ChatApi().dialect(plan or chat_plan(), StreamBounds(), collect=collect)
    # Pinned: the gateway's id is random per request (spec §21), the relay's
    # byte-for-byte checks need one they can write down.
    dialect.id = GATEWAY_ID  # type: ignore[attr-defined]
    return Relay(
        dialect, timeouts=timeouts, response_headers=HEADERS, abort=abort, body_writer=body_writer
    )


GATEWAY_ID = "chatcmpl-test"


def _expected_frames(raw: bytes, *, include_usage: bool = True) -> list[bytes]:
    """What the caller must get for a plain LF-framed capture, worked out here
    without the validator: keep-alives as ``:\\n\\n``, each chunk with the
    alias for its model, no ``[DONE]``."""
    frames = []
    for block in raw.split(b"\n\n"):
        if not block or block == DONE.strip():
            continue
        if block.startswith(b":"):
            frames.append(KEEPALIVE_FRAME)
            continue
        data = orjson.loads(block.removeprefix(b"data: "))
        data["id"] = GATEWAY_ID
        data["model"] = ALIAS
        if not include_usage:
            data.pop("usage", None)
        elif data.get("usage"):
            data["usage"] = counts_only(data["usage"])
        frames.append(b"data: " + orjson.dumps(data) + b"\n\n")
    return frames


def _random_splits(raw: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(raw)), k=min(40, len(raw) - 1)))
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


def _bytewise(raw: bytes) -> list[bytes]:
    return [raw[i : i + 1] for i in range(len(raw))]


async def _stream(relay: Relay, pieces: list[bytes], caller: Caller) -> FakeUpstream:
    upstream = FakeUpstream(pieces)
    async with asyncio.timeout(5):
        await relay.stream_to(upstream.opener(), caller.send)
    return upstream


def _user_chunk() -> dict[str, Any]:
    bad = chunk("x")
    bad["choices"][0]["delta"]["role"] = "user"
    return bad


def _error_frame(code: ErrorCode | GatewayError) -> bytes:
    exc = GatewayError(code) if isinstance(code, str) else code
    return b"data: " + orjson.dumps(exc.body()) + b"\n\n"


# -- a valid stream -----------------------------------------------------------


@pytest.mark.parametrize(
    "split",
    ["whole", "bytewise", "random-1", "random-2", "random-3"],
)
async def test_every_frame_reaches_the_caller_in_order(split: str) -> None:
    pieces = {
        "whole": [VALID],
        "bytewise": _bytewise(VALID),
    }.get(split) or _random_splits(VALID, int(split[-1]))
    relay, caller = _relay(), Caller()
    await _stream(relay, pieces, caller)
    assert caller.body == b"".join(_expected_frames(VALID))
    assert DONE not in caller.body
    assert all(m.get("more_body") is True for m in caller.messages[1:])


async def test_headers_go_out_once_with_the_first_event() -> None:
    relay, caller = _relay(), Caller()
    await _stream(relay, _bytewise(VALID), caller)
    assert caller.messages[0] == {
        "type": "http.response.start",
        "status": 200,
        "headers": HEADERS,
    }
    assert len(caller.starts) == 1
    # The first body message is the first event (a keep-alive), nothing else.
    assert caller.messages[1]["body"] == KEEPALIVE_FRAME
    assert relay.state.headers_sent


async def test_events_of_one_read_go_in_one_send() -> None:
    whole, bytewise = Caller(), Caller()
    await _stream(_relay(), [VALID], whole)
    await _stream(_relay(), _bytewise(VALID), bytewise)
    assert len(whole.bodies) == 1
    # Byte by byte, each event completes in its own read: 3 keep-alives + 8 chunks.
    assert len(bytewise.bodies) == 11
    assert whole.body == bytewise.body


@pytest.mark.parametrize("name", ["chat_valid_crlf.sse", "chat_valid_cr.sse"])
async def test_line_endings_do_not_change_what_the_caller_gets(name: str) -> None:
    plain, other = Caller(), Caller()
    await _stream(_relay(), [VALID], plain)
    await _stream(_relay(), _random_splits(sse_fixture(name), 7), other)
    assert other.body == plain.body


async def test_usage_is_dropped_from_frames_unless_asked_for() -> None:
    caller = Caller()
    await _stream(_relay(chat_plan(include_usage=False)), [VALID], caller)
    assert caller.body == b"".join(_expected_frames(VALID, include_usage=False))
    assert b'"usage"' not in caller.body


async def test_stream_to_returns_before_the_terminator_and_end_sends_it() -> None:
    relay, caller = _relay(), Caller()
    await _stream(relay, [VALID], caller)
    assert not relay.state.completed and not relay.state.finished
    count = len(caller.messages)
    await relay.end(caller.send)
    assert len(caller.messages) == count + 1
    assert caller.messages[-1] == {"type": "http.response.body", "body": DONE}
    assert relay.state.completed and relay.state.finished


async def test_keepalives_pass_through_in_place() -> None:
    raw = b":\n\n" + event(chunk("a")) + b":\n\n:\n\n" + event(chunk("", "stop", usage()))
    relay, caller = _relay(), Caller()
    await _stream(relay, _bytewise(raw + DONE), caller)
    kinds = [b"ka" if body == KEEPALIVE_FRAME else b"ev" for body in caller.bodies]
    assert kinds == [b"ka", b"ev", b"ka", b"ka", b"ev"]


async def test_first_content_time_is_taken_at_the_first_content() -> None:
    relay = _relay()
    upstream = FakeUpstream([b":\n\n"], end=False)
    task = asyncio.create_task(relay.stream_to(upstream.opener(), Caller().send))
    await eventually_async(lambda: relay.state.headers_sent, "the keep-alive was relayed")
    assert relay.state.first_content_at is None  # a keep-alive is no content
    upstream.feed(event(chunk("a")))
    upstream.feed(event(chunk("", "stop", usage())) + DONE)
    upstream.finish()
    async with asyncio.timeout(5):
        await task
    assert relay.state.first_content_at is not None


# -- a stream that fails ------------------------------------------------------


@pytest.mark.parametrize("name", ["bad_missing_done.sse", "bad_truncated_mid_line.sse"])
@pytest.mark.parametrize("split", ["whole", "bytewise"])
async def test_a_stream_cut_before_its_end_ends_with_one_error_frame(name: str, split: str) -> None:
    raw = sse_fixture(name)
    relay, caller = _relay(), Caller()
    upstream = FakeUpstream([raw] if split == "whole" else _bytewise(raw))
    with pytest.raises(GatewayError) as caught:
        async with asyncio.timeout(5):
            await relay.stream_to(upstream.opener(), caller.send)
    # EOF before [DONE] is the framing's rule (gateway/core/sse.py): incomplete.
    assert (caught.value.code, caught.value.outcome) == ("upstream_unavailable", "incomplete")
    assert relay.state.headers_sent and relay.state.finished and not relay.state.completed
    assert caller.messages[-1] == {"type": "http.response.body", "body": _error_frame(caught.value)}
    assert caller.body.count(b'"error"') == 1
    assert DONE not in caller.body


async def test_a_broken_worker_connection_after_headers_ends_with_its_error() -> None:
    relay, caller = _relay(), Caller()
    upstream = FakeUpstream([event(chunk("a"))], end=False)
    upstream.fail(GatewayError("upstream_unavailable"))
    with pytest.raises(GatewayError, match="upstream_unavailable"):
        async with asyncio.timeout(5):
            await relay.stream_to(upstream.opener(), caller.send)
    assert caller.bodies[-1] == _error_frame("upstream_unavailable")
    assert len(caller.bodies) == 2


@pytest.mark.parametrize("split", ["whole", "bytewise", "random-5"])
async def test_events_before_an_invalid_one_still_reach_the_caller(split: str) -> None:
    raw = sse_fixture("bad_role.sse")
    pieces = {"whole": [raw], "bytewise": _bytewise(raw)}.get(split) or _random_splits(raw, 5)
    relay, caller = _relay(), Caller()
    with pytest.raises(GatewayError) as caught:
        await _stream(relay, pieces, caller)
    assert caught.value.code == "upstream_protocol_error"
    frames = caller.body.split(b"\n\n")[:-1]
    # 3 events pass (the fixture's "events_before"), then the error; no terminator.
    assert len(frames) == 4
    assert frames[-1] + b"\n\n" == _error_frame(caught.value)
    assert DONE not in caller.body


async def test_the_workers_in_band_error_event_becomes_upstream_error() -> None:
    relay, caller = _relay(), Caller()
    raw = b":\n\n" + sse_fixture("bad_error_event_first.sse")
    with pytest.raises(GatewayError, match="upstream_error"):
        await _stream(relay, [raw], caller)
    # The keep-alive sent the headers, so the failure ends the open stream.
    assert caller.bodies == [KEEPALIVE_FRAME, _error_frame("upstream_error")]


@pytest.mark.parametrize(
    "raw",
    [
        sse_fixture("bad_error_event_first.sse"),
        b'data: {"not":"a chunk"}\n\n',
        event(_user_chunk()),
        b"",
    ],
    ids=["error-event", "not-a-chunk", "bad-role", "empty-body"],
)
async def test_a_failure_before_headers_raises_without_any_send(raw: bytes) -> None:
    relay, caller = _relay(), Caller()
    with pytest.raises(GatewayError):
        await _stream(relay, [raw] if raw else [], caller)
    assert caller.messages == []
    assert not relay.state.headers_sent and not relay.state.finished


async def test_an_opener_failure_propagates_before_headers() -> None:
    relay, caller = _relay(), Caller()

    async def refuse() -> UpstreamStream:
        raise GatewayError("upstream_rejected")

    with pytest.raises(GatewayError, match="upstream_rejected"):
        await relay.stream_to(refuse, caller.send)
    assert caller.messages == [] and relay.upstream is None


class _EndlessSource:
    """A source that never ends validly and never says why (NEED_DATA at EOF)."""

    bytes_received = 0

    def receive_data(self, data: bytes) -> None:
        self.bytes_received += len(data)

    def next_event(self) -> NeedData:
        return NEED_DATA


class _SilentDialect:
    has_content = False
    terminal_frame = DONE
    usage_source = "reported"

    def __init__(self) -> None:
        self.source = _EndlessSource()

    def on_item(self, item: Any) -> bytes | None:
        raise AssertionError("no item was ever released")

    def error_frame(self, exc: GatewayError) -> bytes:
        return b"error\n\n"

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {}

    def report(self) -> Report:
        return Report()


async def test_a_body_that_ends_without_the_sources_end_is_a_protocol_error() -> None:
    relay = Relay(cast(Dialect, _SilentDialect()), timeouts=SLOW, response_headers=[])
    with pytest.raises(GatewayError, match="upstream_protocol_error"):
        await relay.collect(FakeUpstream([b"partial"]).opener())
    assert relay.stream_sha256 == hashlib.sha256(b"partial").hexdigest()


# -- deadlines and a caller that stops reading --------------------------------


async def test_first_event_timeout_is_upstream_timeout_without_a_send() -> None:
    relay, caller = _relay(timeouts=Timeouts(0.05, 5, 5)), Caller()
    # Bytes that complete no event do not count as the first event.
    upstream = FakeUpstream([b"data: {"], end=False)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(GatewayError) as caught:
        async with asyncio.timeout(5):
            await relay.stream_to(upstream.opener(), caller.send)
    assert caught.value.code == "upstream_timeout"
    assert loop.time() - start < 4
    assert caller.messages == []
    assert relay.close() is True and upstream.close_calls == 1


async def test_the_first_event_deadline_covers_opening_the_stream() -> None:
    relay = _relay(timeouts=Timeouts(0.05, 5, 5))

    async def never() -> UpstreamStream:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    with pytest.raises(GatewayError, match="upstream_timeout"):
        async with asyncio.timeout(5):
            await relay.collect(never)


async def test_idle_timeout_after_headers_ends_with_the_timeout_frame() -> None:
    relay, caller = _relay(timeouts=Timeouts(5, 0.05, 5)), Caller()
    upstream = FakeUpstream([event(chunk("a"))], end=False)
    with pytest.raises(GatewayError, match="upstream_timeout"):
        async with asyncio.timeout(4):
            await relay.stream_to(upstream.opener(), caller.send)
    assert caller.bodies[-1] == _error_frame("upstream_timeout")
    assert caller.body.count(b'"error"') == 1
    assert relay.state.finished and not relay.state.completed


@pytest.mark.parametrize("before", [b"", event(chunk("a"))], ids=["first-event", "idle"])
async def test_the_total_deadline_caps_every_other(before: bytes) -> None:
    relay = _relay(timeouts=Timeouts(30, 30, 0.05))
    upstream = FakeUpstream([before] if before else [], end=False)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(GatewayError, match="upstream_timeout"):
        async with asyncio.timeout(5):
            await relay.collect(upstream.opener())
    assert loop.time() - start < 5


async def test_a_send_blocked_past_the_deadline_is_caller_stalled() -> None:
    # The caller takes the headers, then never the first body message.
    relay, caller = _relay(timeouts=Timeouts(5, 0.05, 5)), Caller(stall_at=1)
    upstream = FakeUpstream([event(chunk("a"))], end=False)
    with pytest.raises(CallerStalled):
        async with asyncio.timeout(4):
            await relay.stream_to(upstream.opener(), caller.send)
    # No error frame is attempted at a caller that does not read.
    assert len(caller.messages) == 2
    frame = {**chunk("a"), "id": GATEWAY_ID, "model": ALIAS}
    assert caller.bodies == [b"data: " + orjson.dumps(frame) + b"\n\n"]
    assert not relay.state.finished


async def test_a_terminator_the_caller_does_not_take_is_caller_stalled() -> None:
    relay = _relay(timeouts=Timeouts(5, 0.05, 5))
    await _stream(relay, [VALID], Caller())
    with pytest.raises(CallerStalled):
        async with asyncio.timeout(4):
            await relay.end(Caller(stall_at=0).send)
    assert not relay.state.completed


async def test_an_error_frame_the_caller_does_not_take_drops_its_connection() -> None:
    aborted: list[bool] = []
    relay = _relay(timeouts=Timeouts(5, 0.05, 5), abort=lambda: aborted.append(True))
    # The caller reads the stream's start, then stops just before the error frame.
    caller = Caller(stall_at=2)
    upstream = FakeUpstream([event(chunk("a"))], end=False)
    with pytest.raises(GatewayError, match="upstream_timeout"):
        async with asyncio.timeout(4):
            await relay.stream_to(upstream.opener(), caller.send)
    assert aborted == [True]
    assert caller.bodies[-1] == _error_frame("upstream_timeout")
    assert relay.state.finished


async def test_end_with_error_without_abort_just_gives_up() -> None:
    relay = _relay()
    caller = Caller(stall_at=0)
    async with asyncio.timeout(4):
        await relay.end_with_error(caller.send, GatewayError("upstream_error"), 0.02)
    assert relay.state.finished and caller.bodies == [_error_frame("upstream_error")]


# -- the listener's body writer ----------------------------------------------


class _Writer:
    """A listener's BodyWriter: records frames; ``paused`` until ``resume``
    (never, for a caller that stopped reading)."""

    def __init__(self, *, ready: bool = True, paused: bool = False) -> None:
        self.frames: list[bytes] = []
        self._ready = ready
        self._writable = asyncio.Event()
        if not paused:
            self._writable.set()
        self.drains = 0

    def ready(self) -> bool:
        return self._ready

    @property
    def paused(self) -> bool:
        return not self._writable.is_set()

    async def drain(self) -> None:
        self.drains += 1
        await self._writable.wait()

    def resume(self) -> None:
        self._writable.set()

    def write(self, body: bytes) -> None:
        self.frames.append(body)


async def test_after_the_head_frames_go_to_the_body_writer_not_send() -> None:
    writer = _Writer()
    relay, caller = _relay(body_writer=writer), Caller()
    await _stream(relay, _random_splits(VALID, 7), caller)
    await relay.end(caller.send)
    # The head and the terminator through send; every frame between through the writer.
    assert [m["type"] for m in caller.messages] == ["http.response.start", "http.response.body"]
    assert caller.bodies == [DONE]
    assert b"".join(writer.frames) == b"".join(_expected_frames(VALID))
    assert writer.drains == 0


async def test_a_writer_that_does_not_apply_leaves_every_frame_to_send() -> None:
    writer = _Writer(ready=False)
    relay, caller = _relay(body_writer=writer), Caller()
    await _stream(relay, [VALID], caller)
    assert writer.frames == []
    assert caller.body == b"".join(_expected_frames(VALID))


async def test_a_full_callers_buffer_is_drained_before_the_next_frame() -> None:
    writer = _Writer(paused=True)
    relay, caller = _relay(body_writer=writer), Caller()
    task = asyncio.ensure_future(_stream(relay, [VALID], caller))
    await eventually_async(lambda: writer.drains == 1, "the relay waits on the drain", 2)
    assert writer.frames == [] and not task.done()  # nothing written while paused
    writer.resume()
    async with asyncio.timeout(4):
        await task
    assert b"".join(writer.frames) == b"".join(_expected_frames(VALID))


async def test_a_drain_past_the_deadline_is_caller_stalled() -> None:
    # The caller took the head, then its buffer stayed full.
    writer = _Writer(paused=True)
    relay, caller = _relay(timeouts=Timeouts(5, 0.05, 5), body_writer=writer), Caller()
    upstream = FakeUpstream([event(chunk("a"))], end=False)
    with pytest.raises(CallerStalled):
        async with asyncio.timeout(4):
            await relay.stream_to(upstream.opener(), caller.send)
    assert writer.frames == [] and writer.drains == 1
    assert len(caller.starts) == 1 and not relay.state.finished


# -- a non-streaming caller ---------------------------------------------------


async def test_collect_then_reply_sends_one_json_answer() -> None:
    relay, caller = _relay(chat_plan(stream=False), collect=True), Caller()
    async with asyncio.timeout(5):
        await relay.collect(FakeUpstream(_random_splits(VALID, 3)).opener())
    assert not relay.state.headers_sent and not relay.state.completed
    answer = relay.dialect.answer({"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21})
    await relay.reply(caller.send, answer, {"x-usage-source": "reported"})
    assert relay.state.completed and relay.state.finished
    start, body = caller.messages
    assert start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"x-usage-source"] == b"reported"
    assert int(headers[b"content-length"]) == len(body["body"])
    parsed = orjson.loads(body["body"])
    assert parsed["model"] == ALIAS and parsed["object"] == "chat.completion"
    assert parsed["choices"][0]["message"]["content"] == VALID_TEXT
    assert parsed["choices"][0]["finish_reason"] == "stop"


async def test_collect_ignores_keepalives_and_sends_nothing() -> None:
    relay = _relay(chat_plan(stream=False), collect=True)
    upstream = FakeUpstream([VALID])
    await relay.collect(upstream.opener())
    assert not relay.state.headers_sent
    assert relay.dialect.report().finish_reason == "stop"
    assert relay.state.first_content_at is not None


async def test_collect_of_a_broken_stream_raises_the_streams_error() -> None:
    relay = _relay(chat_plan(stream=False), collect=True)
    with pytest.raises(GatewayError, match="upstream_protocol_error"):
        await relay.collect(FakeUpstream([sse_fixture("bad_usage_arith.sse")]).opener())
    assert not relay.state.finished


# -- close and the stream's digest --------------------------------------------


async def test_close_before_any_stream_is_false() -> None:
    assert _relay().close() is False


async def test_close_after_the_body_ended_is_false() -> None:
    relay = _relay()
    upstream = await _stream(relay, [VALID], Caller())
    assert upstream.closed
    assert relay.close() is False
    assert upstream.close_calls == 0


async def test_close_of_an_open_stream_is_true_once() -> None:
    relay = _relay(timeouts=Timeouts(5, 0.02, 5))
    upstream = FakeUpstream([event(chunk("a"))], end=False)
    with pytest.raises(GatewayError):
        await relay.stream_to(upstream.opener(), Caller().send)
    assert relay.close() is True
    assert upstream.close_calls == 1 and upstream.closed
    assert relay.close() is False
    assert upstream.close_calls == 1


async def test_stream_sha256_is_none_before_any_byte() -> None:
    relay = _relay()
    assert relay.stream_sha256 is None
    with pytest.raises(GatewayError):
        await relay.collect(FakeUpstream([]).opener())
    assert relay.stream_sha256 is None


@pytest.mark.parametrize("split", ["whole", "random-9"])
async def test_stream_sha256_is_the_digest_of_every_byte_read(split: str) -> None:
    relay = _relay()
    pieces = [VALID] if split == "whole" else _random_splits(VALID, 9)
    await _stream(relay, pieces, Caller())
    assert relay.stream_sha256 == hashlib.sha256(VALID).hexdigest()


async def test_stream_sha256_covers_the_bytes_of_a_failed_stream_too() -> None:
    raw = sse_fixture("bad_role.sse")
    relay = _relay()
    with pytest.raises(GatewayError):
        await _stream(relay, [raw], Caller())
    assert relay.stream_sha256 == hashlib.sha256(raw).hexdigest()
