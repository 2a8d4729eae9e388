"""``POST /v1/audio/speech``: real WAV and PCM bodies, the worker's request rules,
faults; and the route kinds one simulator serves (chat, image, speech)."""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.testing.simulator import SPEECH_FAULTS, Simulator
from tests.testing.simulator.wire import Raw, exchange, http_request, parse

CHAT = "/m/chat"
IMAGE = "/m/image"
SPEECH = "/m/speech"
EMBED = "/m/embed"
AUDIO = "/v1/audio/speech"
WAV_TYPE = "audio/wav; rate=44100; channels=1"
PCM_TYPE = "audio/pcm; codecs=1; format=s16le; rate=44100; channels=1"


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    routes: list[str | tuple[str, str]] = [CHAT, (IMAGE, "image"), (SPEECH, "speech")]
    simulator = Simulator(model_ids=[*routes, (EMBED, "embeddings")], id_seed=12)
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def client(sim: Simulator) -> Iterator[httpx.Client]:
    sim.reset()
    with httpx.Client(base_url=sim.base_url, timeout=10) as c:
        yield c


def say(text: str = "hello", fmt: str | None = "wav", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": SPEECH, "input": text, **extra}
    if fmt is not None:
        body["response_format"] = fmt
    return body


def worker_header(data: int, rate: int = 44_100, channels: int = 1) -> bytes:
    """``write_pcm_as_wav``'s header, written out field by field."""
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", data)
    )


# ---------------------------------------------------------------- answers


def test_wav_is_a_real_riff_wave_pcm_file(client: httpx.Client) -> None:
    response = client.post(AUDIO, json=say("hello there"))  # 11 characters: 660 ms
    assert response.status_code == 200
    assert response.headers["content-type"] == WAV_TYPE
    assert "transfer-encoding" not in response.headers
    body = response.content
    assert int(response.headers["content-length"]) == len(body)
    frames = 44_100 * 660 // 1000
    assert body[:44] == worker_header(2 * frames) and len(body) == 44 + 2 * frames
    with wave.open(io.BytesIO(body)) as parsed:
        assert (parsed.getnchannels(), parsed.getsampwidth(), parsed.getframerate()) == (
            1,
            2,
            44_100,
        )
        assert parsed.getnframes() == frames
        samples = struct.unpack(f"<{frames}h", parsed.readframes(frames))
    assert samples[:3] == (0, 514, 1026) and max(samples) == 8191  # a 441 Hz sine, amplitude 0.25
    assert samples[100:200] == samples[:100]
    assert client.post(AUDIO, json=say("hello there")).content == body  # deterministic


def test_pcm_is_the_same_samples_raw(client: httpx.Client) -> None:
    wav = client.post(AUDIO, json=say("hi [[sim audio_ms=250]]")).content
    pcm = client.post(AUDIO, json=say("hi [[sim audio_ms=250]]", "pcm"))
    assert pcm.headers["content-type"] == PCM_TYPE
    assert pcm.content == wav[44:] and len(pcm.content) == 2 * 44_100 // 4


def test_rate_channels_and_size_knobs(client: httpx.Client) -> None:
    stereo = client.post(AUDIO, json=say("[[sim sample_rate=24000 channels=2 audio_ms=100]]"))
    assert stereo.headers["content-type"] == "audio/wav; rate=24000; channels=2"
    with wave.open(io.BytesIO(stereo.content)) as parsed:
        assert (parsed.getnchannels(), parsed.getframerate(), parsed.getnframes()) == (
            2,
            24_000,
            2400,
        )
    exact = client.post(AUDIO, json=say("[[sim audio_bytes=1000]]"))
    assert len(exact.content) == 1000 and exact.content[:44] == worker_header(956)


def test_a_64_mib_answer_streams_to_the_client(sim: Simulator, client: httpx.Client) -> None:
    size = 64 * 1024 * 1024
    with client.stream("POST", AUDIO, json=say("[[sim audio_bytes=67108864]]", "pcm")) as response:
        assert int(response.headers["content-length"]) == size
        received = sum(len(piece) for piece in response.iter_bytes(1 << 20))
    assert received == size
    assert sim.requests()[0].bytes_sent > size


def test_the_worker_request_rules(client: httpx.Client) -> None:
    for fmt in ("mp3", "opus", "aac", "flac"):
        refused = client.post(AUDIO, json=say(fmt=fmt))
        assert (refused.status_code, refused.json()) == (
            422,
            {"message": "Only support wav/pcm response format."},
        )
    for body in (
        say(fmt=None),
        say(fmt="WAV"),
        say(fmt="ogg"),
        {"model": SPEECH, "response_format": "wav"},
    ):
        refused = client.post(AUDIO, json=body)
        assert refused.status_code == 422 and refused.headers["content-type"].startswith(
            "text/plain"
        ), body
    assert "missing field `response_format`" in client.post(AUDIO, json=say(fmt=None)).text
    unknown = client.post(AUDIO, json=say(model="/m/none"))
    assert unknown.status_code == 500
    assert (
        client.post(AUDIO, json=say(model="/m/none", fmt="mp3")).status_code == 500
    )  # model first
    for model in (CHAT, IMAGE, EMBED):
        other = client.post(AUDIO, json=say(model=model))
        assert other.status_code == 422 and "incompatible" in other.json()["message"]
    assert client.post(AUDIO, json=say("[[sim fault=bad_riff]]", "pcm")).status_code == 400
    assert client.post(AUDIO, json=say("[[sim fault=odd_pcm]]")).status_code == 400
    failed = client.post(AUDIO, json=say("[[sim status=500]]"))
    assert (failed.status_code, failed.json()) == (500, {"message": "simulated failure"})
    assert client.get(AUDIO).status_code == 405


# ------------------------------------------------------------------ faults


def _data_size(raw: Raw) -> int:
    (size,) = struct.unpack("<I", raw.body[40:44])
    return int(size)


def _cut(raw: Raw) -> bool:
    declared = int(raw.header("content-length") or 0)
    return raw.status == 200 and not raw.terminated and 0 < len(raw.body) < declared


_WAV = 44 + 2 * 44_100 // 5  # 200 ms
FAULT_CHECKS: dict[str, tuple[str, Callable[[Raw], bool]]] = {
    "bad_riff": ("wav", lambda r: r.body[:4] == b"RIFX" and r.body[8:12] == b"WAVE"),
    "size_mismatch": ("wav", lambda r: _data_size(r) == len(r.body) - 44 + 2),
    "not_pcm": ("wav", lambda r: r.body[20:22] == b"\x03\x00"),
    "odd_pcm": ("pcm", lambda r: len(r.body) == _WAV - 44 + 1 and r.terminated),
    "oversize": ("pcm", lambda r: int(r.header("content-length") or 0) == 64 * 1024 * 1024 + 2),
    "close_mid": ("wav", _cut),
    "hang": ("wav", lambda r: r.head_bytes == 0 and r.ending == "timeout"),
    "hang_headers": ("wav", lambda r: r.head_bytes == 0 and r.ending == "timeout"),
    "redirect": ("wav", lambda r: r.status == 307),
    "huge_headers": ("wav", lambda r: r.head_bytes > 200 * 1024 and len(r.body) == _WAV),
    "wrong_request_id": ("wav", lambda r: r.header("x-request-id") not in (None, "mine-1")),
    "no_request_id": ("wav", lambda r: r.header("x-request-id") is None),
    "wrong_content_type": (
        "pcm",
        lambda r: r.header("content-type") == "text/plain; charset=utf-8",
    ),
}


def test_every_speech_fault_has_a_check() -> None:
    assert set(FAULT_CHECKS) == SPEECH_FAULTS


@pytest.mark.parametrize("fault", sorted(FAULT_CHECKS))
def test_speech_fault_produces_its_bytes(sim: Simulator, fault: str) -> None:
    sim.reset()
    fmt, check = FAULT_CHECKS[fault]
    sent = http_request(
        AUDIO, say(f"[[sim fault={fault} audio_ms=200]]", fmt), headers={"x-request-id": "mine-1"}
    )
    hangs = "hang" in fault
    limit = 1 << 20 if fault == "oversize" else 1 << 24
    raw = parse(
        exchange(sim.port, sent, 0.5 if hangs else 10.0, limit), "timeout" if hangs else "eof"
    )
    assert check(raw), (raw.status, raw.headers, raw.body[:64])


# ---------------------------------------------------------- route kinds


def test_one_simulator_serves_a_route_of_each_kind(client: httpx.Client) -> None:
    listed = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == ["default", CHAT, IMAGE, SPEECH, EMBED]
    assert all(
        set(m) == {"id", "object", "created", "owned_by", "root", "status"} for m in listed[1:]
    )
    chat = {"model": CHAT, "messages": "[[sim chunks=1]]"}
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert client.post("/v1/embeddings", json={"model": CHAT, "input": "x"}).status_code == 200
    assert client.post("/v1/embeddings", json={"model": EMBED, "input": "x"}).status_code == 200
    incompatible = {"message": "Received a request incompatible for this model's category."}
    for model in (IMAGE, SPEECH, EMBED):
        plain = client.post("/v1/chat/completions", json={"model": model, "messages": "hi"})
        assert (plain.status_code, plain.json()) == (422, incompatible)
        streamed = client.post(
            "/v1/chat/completions", json={"model": model, "messages": "hi", "stream": True}
        )
        assert (
            streamed.status_code == 200 and streamed.headers["content-type"] == "text/event-stream"
        )
        assert streamed.text == (
            'data: {"error":{"message":"Received a request incompatible for this model'
            '\'s category.","type":"server_error","param":null,"code":null}}\n\ndata: [DONE]\n\n'
        )
        assert client.post("/v1/responses", json={"model": model, "input": "x"}).status_code == 422
    for model in (IMAGE, SPEECH):
        assert client.post("/v1/embeddings", json={"model": model, "input": "x"}).status_code == 422
    messages = {"model": SPEECH, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    assert client.post("/v1/messages", json=messages).status_code == 400


def test_route_kind_rules() -> None:
    with pytest.raises(ValueError, match="route kind"):
        Simulator(model_ids=[("/m/x", "video")])
    assert Simulator(model_ids=[("/m/x", "speech"), "/m/y"]).model_ids == ("/m/x", "/m/y")
