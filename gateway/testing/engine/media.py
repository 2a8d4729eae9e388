"""Image and speech bodies as ``mistralrs serve`` reads and writes them (pure; test equipment).

Requests (``mistralrs-agents-media.md`` §1, §2; unknown fields ignored, a
known field of the wrong type or an unknown variant is axum's 422 text):

* ``/v1/images/generations``: ``model`` (``default``), ``prompt`` (required),
  ``n`` (read, ignored: one image), ``response_format`` ``"Url"`` (default) or
  ``"B64Json"`` -- the Rust variant names, case-sensitive, so OpenAI's
  ``url``/``b64_json`` are refused -- and ``height``/``width`` (720, 1280).
* ``/v1/audio/speech``: ``model``, ``input`` (required), ``response_format``
  (required; ``mp3 opus aac flac wav pcm``: the server accepts the six, then
  answers 422 ``Only support wav/pcm response format.`` for the first four).

Speech answers are the engine's PCM floats written as the server writes them:
``pcm`` as 16-bit little-endian samples (``Sample::to_i16``: clamped to
[-1, 1], times 32767 in f32, truncated toward zero; NaN is 0), ``wav`` as a
RIFF file around the same samples (``write_pcm_as_wav``); the content type
``audio/wav; rate=<hz>; channels=<n>`` or ``audio/pcm; codecs=1;
format=s16le; rate=<hz>; channels=<n>``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

IMAGE_FORMATS = ("Url", "B64Json")
AUDIO_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
SERVED_AUDIO = ("wav", "pcm")
ONLY_WAV_PCM = "Only support wav/pcm response format."


class MediaBodyError(ValueError):
    """The body does not deserialize into the server's request type (422 text)."""


@dataclass(frozen=True)
class ImageRequest:
    model: str
    prompt: str
    response_format: str
    height: int
    width: int


@dataclass(frozen=True)
class SpeechRequest:
    model: str
    input: str
    response_format: str


def image_request(body: dict[str, Any]) -> ImageRequest:
    prompt = _required(body, "prompt", str)
    _unsigned(body, "n", 1)
    response_format = body.get("response_format", "Url")
    if response_format not in IMAGE_FORMATS:
        raise MediaBodyError(
            f"response_format: unknown variant `{response_format}`, expected `Url` or `B64Json`"
        )
    return ImageRequest(
        model=_model(body),
        prompt=prompt,
        response_format=response_format,
        height=_unsigned(body, "height", 720),
        width=_unsigned(body, "width", 1280),
    )


def speech_request(body: dict[str, Any]) -> SpeechRequest:
    text = _required(body, "input", str)
    response_format = _required(body, "response_format", str)
    if response_format not in AUDIO_FORMATS:
        expected = ", ".join(f"`{f}`" for f in AUDIO_FORMATS)
        raise MediaBodyError(
            f"response_format: unknown variant `{response_format}`, expected one of {expected}"
        )
    return SpeechRequest(model=_model(body), input=text, response_format=response_format)


def pcm16(samples: list[float]) -> bytes:
    """``Sample::to_i16`` on every sample, little-endian."""
    values = np.asarray(samples, dtype=np.float32)
    clamped = np.clip(values, np.float32(-1.0), np.float32(1.0)) * np.float32(32767.0)
    ints = np.where(np.isnan(clamped), np.float32(0.0), clamped).astype(np.int16)
    return ints.astype("<i2").tobytes()


def wav(samples: list[float], rate: int, channels: int) -> bytes:
    """``write_pcm_as_wav``: a 44-byte RIFF/WAVE header (PCM, 16 bits), then the samples."""
    data = pcm16(samples)
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * 2 * channels,
                                    2 * channels, 16)  # fmt: skip
    return header + b"data" + struct.pack("<I", len(data)) + data


def audio_content_type(response_format: str, rate: int, channels: int) -> str:
    """``AudioResponseFormat::audio_content_type`` for the two formats served."""
    base = "audio/wav" if response_format == "wav" else "audio/pcm; codecs=1; format=s16le"
    return f"{base}; rate={rate}; channels={channels}"


def _model(body: dict[str, Any]) -> str:
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise MediaBodyError("model: invalid type: expected a string")
    return model


def _required(body: dict[str, Any], name: str, kind: type[Any]) -> Any:
    if name not in body:
        raise MediaBodyError(f"missing field `{name}`")
    value = body[name]
    if not isinstance(value, kind):
        raise MediaBodyError(f"{name}: invalid type: expected {kind.__name__}")
    return value


def _unsigned(body: dict[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MediaBodyError(f"{name}: invalid type: expected usize")
    return value
