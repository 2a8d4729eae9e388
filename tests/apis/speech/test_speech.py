"""``POST /v1/audio/speech`` (spec §23, §24): planning, and the worker's audio
checked whole before the caller gets a byte."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.apis.base import PlanContext
from gateway.apis.speech.api import AudioBody, SpeechApi, SpeechDialect, SpeechRequest
from gateway.apis.speech.audio import check_wav, media_type
from gateway.config import SpeechConfig
from gateway.core.errors import GatewayError
from gateway.core.replies import Pieces
from gateway.core.sse import NEED_DATA, Done
from tests.pipeline.support import ALIAS, NONCE, ROUTE, make_tenant
from tests.support.media import wav, wav_header

API = SpeechApi()
WAV_TYPE = b"audio/wav; rate=24000; channels=1"
PCM_TYPE = b"audio/pcm; codecs=1; format=s16le; rate=24000; channels=1"


def ctx(**speech: Any) -> PlanContext:
    return PlanContext(make_tenant(), NONCE, speech=SpeechConfig(**speech))


def refusal(body: dict[str, Any], context: PlanContext | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        API.plan({"model": ALIAS, "input": "Hello there.", **body}, context or ctx())
    return caught.value


# -- planning ------------------------------------------------------------------


def test_the_worker_gets_model_input_and_format_only() -> None:
    body = {
        "model": ALIAS,
        "input": "Hello there.",
        "voice": "alloy",
        "speed": 1.25,
        "instructions": "cheerful",
        "stream_format": "audio",
    }
    plan = API.plan(body, ctx())
    assert API.forward(plan, ROUTE) == {
        "model": ROUTE,
        "input": "Hello there.",
        "response_format": "wav",
    }
    assert plan.detail == SpeechRequest("wav", 67_108_864)
    assert (plan.calls, plan.bills_tokens, plan.max_tokens) == (1, False, None)
    pcm = API.plan({"model": ALIAS, "input": "x", "response_format": "pcm"}, ctx())
    assert API.forward(pcm, ROUTE)["response_format"] == "pcm"


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_formats_the_worker_cannot_make_are_unsupported_naming_the_served_ones(fmt: str) -> None:
    error = refusal({"response_format": fmt})
    assert (error.code, error.param) == ("unsupported_field", "response_format")
    assert "wav" in error.message and "pcm" in error.message


def test_sse_streaming_is_unsupported() -> None:
    error = refusal({"stream_format": "sse"})
    assert (error.code, error.param) == ("unsupported_field", "stream_format")
    assert "audio" in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": "WAV"}, "response_format"),
        ({"response_format": 1}, "response_format"),
        ({"stream_format": "chunks"}, "stream_format"),
        ({"input": ""}, "input"),
        ({"input": ["a"]}, "input"),
    ],
)
def test_malformed_fields_are_invalid_request(body: dict[str, Any], param: str) -> None:
    error = refusal(body)
    assert (error.code, error.param) == ("invalid_request", param)


def test_input_is_bounded_in_characters() -> None:
    small = ctx(max_input_chars=10)
    assert API.plan({"model": ALIAS, "input": "é" * 10}, small).prompt_bytes == 20
    error = refusal({"input": "x" * 11}, small)
    assert (error.code, error.status, error.param) == ("prompt_too_large", 400, "input")
    assert refusal({"input": "x" * 4097}).code == "prompt_too_large"


@pytest.mark.parametrize("field", ["model_voice", "language", "stream"])
def test_other_fields_are_unsupported(field: str) -> None:
    assert refusal({field: 1}).param == field


def test_the_endpoint_runs_on_speech_routes_with_its_own_cost() -> None:
    endpoint = API.endpoint
    assert endpoint.route_kinds == frozenset({"speech"})
    assert (endpoint.cost, endpoint.exchange, endpoint.name) == ("speech", "audio", "speech")


# -- the answer ----------------------------------------------------------------


def read(fmt: str, content_type: bytes, body: bytes, *, max_bytes: int = 1 << 20) -> SpeechDialect:
    dialect = SpeechDialect(SpeechRequest(fmt, max_bytes))
    source = dialect.source
    source.receive_head(content_type)
    for at in range(0, len(body), 1000):
        source.receive_data(body[at : at + 1000])
        assert source.next_event() is NEED_DATA
    source.receive_data(b"")
    item = source.next_event()
    assert isinstance(item, bytes)
    dialect.on_item(item)
    assert isinstance(source.next_event(), Done)
    return dialect


def test_a_wav_is_relayed_as_its_bytes_under_exactly_audio_wav() -> None:
    body = wav(24_000)  # one second
    dialect = read("wav", WAV_TYPE, body)
    answer = dialect.answer({})
    assert isinstance(answer, Pieces) and answer.media_type == b"audio/wav"
    assert b"".join(bytes(p) for p in answer.pieces) == body
    report = dialect.report()
    assert report.media_usage == {"audio_ms": 1000}
    assert report.outputs == [
        {"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body), "duration_ms": 1000}
    ]
    assert dialect.has_content is False


def test_pcm_takes_its_rate_and_channels_from_the_head() -> None:
    samples = b"\x01\x00" * 2 * 4800  # 0.1 s of stereo at 48 kHz
    head = b"audio/pcm; codecs=1; format=s16le; rate=48000; channels=2"
    dialect = read("pcm", head, samples)
    answer = dialect.answer({})
    assert answer.media_type == b"audio/pcm;rate=48000;channels=2"
    assert dialect.report().media_usage == {"audio_ms": 100}


def _riff_size(body: bytes, delta: int) -> bytes:
    size = int.from_bytes(body[4:8], "little") + delta
    return body[:4] + size.to_bytes(4, "little") + body[8:]


@pytest.mark.parametrize(
    ("fmt", "content_type", "body"),
    [
        pytest.param("wav", WAV_TYPE, b"RIFX" + wav(100)[4:], id="not_riff"),
        pytest.param("wav", WAV_TYPE, wav(100)[:8] + b"WAVX" + wav(100)[12:], id="not_wave"),
        pytest.param("wav", WAV_TYPE, wav_header(202) + b"\x00" * 200, id="data_size_mismatch"),
        pytest.param("wav", WAV_TYPE, _riff_size(wav(100), 2), id="riff_size_mismatch"),
        pytest.param("wav", WAV_TYPE, wav_header(200, tag=3) + b"\x00" * 200, id="float"),
        pytest.param("wav", WAV_TYPE, wav(100)[:40], id="no_data_chunk"),
        pytest.param("wav", WAV_TYPE, wav_header(201) + b"\x00" * 201, id="half_frame"),
        pytest.param("wav", b"audio/wav; rate=8000", wav(100), id="rate_disagrees"),
        pytest.param("wav", b"audio/wav; channels=2", wav(100), id="channels_disagree"),
        pytest.param("wav", PCM_TYPE, wav(100), id="pcm_for_wav"),
        pytest.param("pcm", WAV_TYPE, b"\x00" * 200, id="wav_for_pcm"),
        pytest.param("pcm", PCM_TYPE, b"\x00" * 201, id="odd_pcm"),
        pytest.param("pcm", b"audio/pcm", b"\x00" * 200, id="pcm_without_rate"),
        pytest.param("pcm", b"audio/pcm; rate=0; channels=1", b"\x00" * 200, id="rate_zero"),
        pytest.param("pcm", b"audio/pcm; rate=x; channels=1", b"\x00" * 200, id="rate_text"),
        pytest.param(
            "pcm", b"audio/pcm; format=f32le; rate=8000; channels=1", b"\x00" * 8, id="f32"
        ),
    ],
)
def test_every_broken_body_is_a_protocol_error(fmt: str, content_type: bytes, body: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        read(fmt, content_type, body)
    assert (caught.value.code, caught.value.status) == ("upstream_protocol_error", 502)


def test_a_wav_with_extra_chunks_before_data_is_read() -> None:
    plain = wav(100)
    extra = b"LIST" + (3).to_bytes(4, "little") + b"abc\x00"  # odd size, padded
    body = plain[:36] + extra + plain[36:]
    body = body[:4] + (len(body) - 8).to_bytes(4, "little") + body[8:]
    audio = check_wav(body, media_type(b"audio/wav"))
    assert (audio.data_start, audio.data_bytes) == (36 + len(extra) + 8, 200)


def test_a_body_over_its_bound_is_refused_as_it_arrives() -> None:
    source = AudioBody(1000)
    source.receive_head(WAV_TYPE)
    source.receive_data(b"x" * 1001)
    with pytest.raises(GatewayError) as caught:
        source.next_event()
    assert caught.value.code == "upstream_protocol_error"
    source.receive_data(b"y" * 10_000)  # counted, never kept
    assert source.bytes_received == 11_001
