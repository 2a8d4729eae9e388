"""The transport for images and speech (spec §23, §24): audio heads accepted for
the audio exchange only, and a worker's 4xx relayed with its message when asked."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import UpstreamConfig
from gateway.core.errors import GatewayError
from gateway.upstream.base import Accept, Rejection
from gateway.upstream.client import Upstream

_ROUTE = "/srv/mosaic-models/sim"


def _reply(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %b\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n%b" % (
        status,
        content_type,
        len(body),
        body,
    )


class _Worker:
    """A loopback worker answering every request with ``reply``; keeps the heads."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        self.done = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                writer.write(self.reply)
                await writer.drain()
                await reader.read()  # until the client closes
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
            self.done.set()


async def _exchange(
    reply: bytes, accept: Accept, rejection: Rejection = "classified"
) -> tuple[bytes, bytes, _Worker]:
    """(content type, body) of one exchange, and the worker that answered it."""
    worker = _Worker(reply)
    server = await asyncio.start_server(worker.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream(UpstreamConfig(base_url=f"http://127.0.0.1:{port}", route=_ROUTE))
    try:
        async with asyncio.timeout(5):
            stream = await upstream.open_stream(
                "/v1/audio/speech", b"{}", "req-1", accept=accept, rejection=rejection
            )
            body = b"".join([piece async for piece in stream])
            return stream.content_type, body, worker
    finally:
        await upstream.aclose()
        async with asyncio.timeout(5):
            await worker.done.wait()  # the client's close ends the handler
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "content_type",
    [
        b"audio/wav; rate=24000; channels=1",
        b"audio/pcm; codecs=1; format=s16le; rate=44100; channels=1",
        b"Audio/WAV",
    ],
)
async def test_an_audio_exchange_takes_the_workers_audio_heads(content_type: bytes) -> None:
    seen, body, worker = await _exchange(_reply(b"200 OK", content_type, b"RIFF"), "audio")
    assert (seen, body) == (content_type, b"RIFF")
    assert b"accept: audio/wav, audio/pcm\r\n" in worker.heads[0]


@pytest.mark.parametrize(
    ("content_type", "accept"),
    [
        (b"audio/wave", "audio"),
        (b"audio/mpeg", "audio"),
        (b"audio/pcmx; rate=1", "audio"),
        (b"application/json", "audio"),
        (b"audio/wav", "json"),
        (b"audio/wav", "sse"),
    ],
)
async def test_other_heads_are_a_protocol_error(content_type: bytes, accept: Accept) -> None:
    with pytest.raises(GatewayError) as caught:
        await _exchange(_reply(b"200 OK", content_type, b"x"), accept)
    assert caught.value.code == "upstream_protocol_error"


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        (
            b"application/json",
            b'{"message":"Only support wav/pcm response format."}',
            "Only support wav/pcm response format.",
        ),
        (b"application/json", b'{"error":{"message":"nested"}}', "nested"),
        (
            b"text/plain",
            b"Failed to deserialize: unknown variant `url`",
            "Failed to deserialize: unknown variant `url`",
        ),
        (b"text/plain", b"line one\nline\x00two\x1b[31m", "line one line two [31m"),
        (b"application/json", b'{"message": 7}', "The inference worker rejected the request."),
        (b"text/plain", b"", "The inference worker rejected the request."),
    ],
)
async def test_a_relayed_4xx_is_invalid_request_with_the_workers_message(
    content_type: bytes, body: bytes, message: str
) -> None:
    with pytest.raises(GatewayError) as caught:
        await _exchange(_reply(b"422 Unprocessable Entity", content_type, body), "json", "relayed")
    error = caught.value
    assert (error.code, error.status, error.message) == ("invalid_request", 400, message)
    assert error.outcome == "upstream_error"


async def test_a_relayed_message_is_cut_to_200_characters() -> None:
    long = b'{"message":"' + b"x" * 15_000 + b'"}'
    with pytest.raises(GatewayError) as caught:
        await _exchange(_reply(b"400 Bad Request", b"application/json", long), "json", "relayed")
    assert caught.value.message == "x" * 200


async def test_a_relayed_4xx_whose_body_never_ends_is_bounded_in_bytes() -> None:
    head = b"HTTP/1.1 422 X\r\ncontent-type: text/plain\r\ncontent-length: 99999999\r\n\r\n"
    with pytest.raises(GatewayError) as caught:
        await _exchange(head + b"y" * 20_000, "json", "relayed")
    assert caught.value.message == "y" * 200


@pytest.mark.parametrize("rejection", ["classified", "relayed"])
async def test_a_500_stays_upstream_error(rejection: Rejection) -> None:
    with pytest.raises(GatewayError) as caught:
        reply = _reply(b"500 Internal Server Error", b"application/json", b'{"message":"boom"}')
        await _exchange(reply, "audio", rejection)
    assert (caught.value.code, caught.value.status) == ("upstream_error", 502)
    assert "boom" not in caught.value.message


async def test_a_classified_4xx_keeps_upstream_rejected() -> None:
    with pytest.raises(GatewayError) as caught:
        await _exchange(_reply(b"422 X", b"application/json", b'{"message":"m"}'), "json")
    assert (caught.value.code, caught.value.message) == (
        "upstream_rejected",
        "The inference worker rejected the request.",
    )
