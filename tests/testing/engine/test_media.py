"""Images and speech on the real engine, straight to the adapter (reference §1, §2).

One adapter serves the generated FLUX, another the generated Dia + DAC
(``mediagen.py``: random weights, generated once per machine and cached).
The pixels and samples are random-weight output; what is checked is what the
engine and the server make of them: the PNG's size, the data URL, the WAV
header around the engine's samples, the errors.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from collections.abc import Iterator

import httpx
import pytest

from gateway.testing.engine import media
from tests.support.engine import EngineAdapter, running_adapter

PNG = b"\x89PNG\r\n\x1a\n"
#: the speech fixture's samples: (audio_length 20 - the 16 delayed frames) x 512
SAMPLES = 2048
INCOMPATIBLE = "Received a request incompatible for this model's category."


@pytest.fixture(scope="module")
def image() -> Iterator[EngineAdapter]:
    with running_adapter(kind="image") as adapter:
        yield adapter


@pytest.fixture(scope="module")
def speech() -> Iterator[EngineAdapter]:
    with running_adapter(kind="speech") as adapter:
        yield adapter


def _post(adapter: EngineAdapter, path: str, body: object) -> httpx.Response:
    return httpx.post(adapter.base_url + path, json=body, timeout=120)


def test_a_b64json_image_is_a_png_data_url_of_the_requested_size(image: EngineAdapter) -> None:
    answer = _post(image, "/v1/images/generations", {
        "model": image.route, "prompt": "a red cat", "response_format": "B64Json",
        "height": 32, "width": 48, "n": 3,
    })  # fmt: skip
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert list(body) == ["created", "data"] and isinstance(body["created"], int)
    (choice,) = body["data"]  # n is read and ignored: one image
    assert list(choice) == ["url", "b64_json"] and choice["url"] is None
    prefix = "data:image/png;base64,"
    assert choice["b64_json"].startswith(prefix)
    png = base64.b64decode(choice["b64_json"][len(prefix) :], validate=True)
    assert png[:8] == PNG and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (48, 32)
    assert len(set(png[33:])) > 16  # random-weight pixels, compressed: not a blank image


def test_a_url_image_is_a_file_name_as_the_server_answers(image: EngineAdapter) -> None:
    answer = _post(image, "/v1/images/generations", {
        "prompt": "a blue sky", "response_format": "Url", "height": 16, "width": 16,
    })  # fmt: skip
    assert answer.status_code == 200
    (choice,) = answer.json()["data"]
    assert choice["b64_json"] is None
    assert re.fullmatch(r"image-generation-[0-9a-f-]{36}\.png", choice["url"])


@pytest.mark.parametrize(
    ("body", "status", "start"),
    [
        ({"prompt": "x", "response_format": "b64_json"}, 422, "Failed to deserialize"),
        ({"prompt": "x", "response_format": "url"}, 422, "Failed to deserialize"),
        ({"response_format": "B64Json"}, 422, "Failed to deserialize"),
        ({"prompt": "x", "model": "another"}, 500, '{"message":"Requested model'),
    ],
    ids=["b64_json-lowercase", "url-lowercase", "no-prompt", "unknown-model"],
)
def test_image_requests_the_server_refuses(
    image: EngineAdapter, body: dict[str, str], status: int, start: str
) -> None:
    answer = _post(image, "/v1/images/generations", body)
    assert answer.status_code == status
    assert answer.text.startswith(start)


def test_the_image_model_refuses_chat_and_speech(image: EngineAdapter) -> None:
    chat = _post(image, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 422
    assert chat.json()["message"].startswith("Received messages for a model which does not")
    audio = _post(image, "/v1/audio/speech", {"input": "hi", "response_format": "wav"})
    assert (audio.status_code, audio.json()) == (422, {"message": INCOMPATIBLE})


def test_wav_speech_is_the_engines_samples_in_a_riff_file(speech: EngineAdapter) -> None:
    wav = _post(speech, "/v1/audio/speech", {"input": "[S1] hello world", "response_format": "wav"})
    assert wav.status_code == 200
    assert wav.headers["content-type"] == "audio/wav; rate=44100; channels=1"
    data = wav.content
    assert len(data) == int(wav.headers["content-length"]) == 44 + 2 * SAMPLES
    assert (data[:4], data[8:16], data[36:40]) == (b"RIFF", b"WAVEfmt ", b"data")
    riff_size, fmt_size, pcm_tag, channels, rate, per_second, align, bits = struct.unpack(
        "<I4x4xIHHIIHH", data[4:36]
    )
    assert (riff_size, fmt_size, pcm_tag, channels, rate) == (len(data) - 8, 16, 1, 1, 44100)
    assert (per_second, align, bits) == (88200, 2, 16)
    assert struct.unpack("<I", data[40:44]) == (2 * SAMPLES,)
    # Dia samples with a seeded sampler: the same input gives the same samples.
    pcm = _post(speech, "/v1/audio/speech", {"input": "[S1] hello world", "response_format": "pcm"})
    assert pcm.status_code == 200
    pcm_type = "audio/pcm; codecs=1; format=s16le; rate=44100; channels=1"
    assert pcm.headers["content-type"] == pcm_type
    assert pcm.content == data[44:]


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"input": "hi", "response_format": "mp3"}, 422, '{"message":"' + media.ONLY_WAV_PCM),
        ({"input": "hi", "response_format": "WAV"}, 422, "Failed to deserialize"),
        ({"input": "hi"}, 422, "Failed to deserialize the JSON body into the target type: missing"),
        ({"response_format": "wav"}, 422, "Failed to deserialize"),
    ],
    ids=["mp3", "uppercase", "no-format", "no-input"],
)
def test_speech_requests_the_server_refuses(
    speech: EngineAdapter, body: dict[str, str], status: int, text: str
) -> None:
    answer = _post(speech, "/v1/audio/speech", body)
    assert answer.status_code == status
    assert answer.text.startswith(text)


def test_the_speech_model_refuses_images(speech: EngineAdapter) -> None:
    answer = _post(speech, "/v1/images/generations", {"prompt": "x", "response_format": "B64Json"})
    assert (answer.status_code, answer.json()) == (422, {"message": INCOMPATIBLE})


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        (0.0, 0),
        (1.0, 32767),
        (-1.0, -32767),
        (160.0, 32767),  # the engine's samples are unbounded: clamped
        (-1e9, -32767),
        (0.5, 16383),  # 16383.5 truncated toward zero
        (-0.5, -16383),
        (math.nan, 0),
        (math.inf, 32767),
    ],
)
def test_samples_become_16_bit_as_the_server_writes_them(sample: float, expected: int) -> None:
    assert media.pcm16([sample]) == struct.pack("<h", expected)
    wav = media.wav([sample, sample], 44100, 1)
    assert wav[44:] == struct.pack("<hh", expected, expected)
    assert struct.unpack("<I", wav[4:8]) == (36 + 4,)
