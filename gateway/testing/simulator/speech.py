"""``POST /v1/audio/speech`` as a ``serve speech`` worker answers it (reference
§13 → agents-media §2). Pure.

Request (``SpeechGenerationRequest``; unknown keys ignored): ``model``
(default ``"default"``), ``input`` required, ``response_format`` required, one
of ``mp3 opus aac flac wav pcm`` (missing, ``null`` or another value: axum's
422 text). ``voice``, ``instructions``, ``speed``, ``stream_format`` are
ignored. After the model check, anything but ``wav``/``pcm`` is 422
``{"message":"Only support wav/pcm response format."}``. Directives:
``[[sim ...]]`` in the input.

Answer: one body with ``content-length``, never streamed:

* ``wav``: a RIFF/WAVE file, PCM s16le (wav.py), ``content-type: audio/wav;
  rate=<hz>; channels=<n>``;
* ``pcm``: the raw samples, ``content-type: audio/pcm; codecs=1;
  format=s16le; rate=<hz>; channels=<n>``.

Size: ``audio_ms`` of sound (knob; 0: 60 ms a character of the input, at
least 200 ms, at most 600 s) at ``sample_rate`` (44100, Dia's) and
``channels`` (1); or ``audio_bytes`` (knob) for the body's size, rounded down
to whole frames (a wav's 44-byte header included). The body is made while it
is written (wav.py), so a 64 MiB answer is never held whole. It comes after
``first_delay_ms + delay_ms``.

Faults (``SPEECH_FAULTS``): ``bad_riff`` (``RIFX`` for ``RIFF``),
``size_mismatch`` (the data chunk declares 2 bytes more than it has),
``not_pcm`` (format tag 3, IEEE float), all three ``wav`` only; ``odd_pcm``
(one byte more: an odd length, ``pcm`` only); ``oversize`` (a body of 64 MiB +
2 bytes, past the gateway's default bound); ``close_mid`` (the head, half
the body, then the cut); the envelope's ``hang``, ``hang_headers``,
``redirect``, ``huge_headers``, ``wrong_request_id``, ``no_request_id``,
``wrong_content_type``; the ``status`` knob (422 and 500 are the worker's).
A wav fault on ``pcm`` (or ``odd_pcm`` on ``wav``) is 400 ``simulator: ...``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import Envelope, PlanStep, RawBody, Reject, envelope
from gateway.testing.simulator.wav import HEADER_BYTES, samples, wav_header

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
OVERSIZE_BYTES = 64 * 1024 * 1024 + 2
_WAV_FAULTS = frozenset({"bad_riff", "size_mismatch", "not_pcm"})


@dataclass(frozen=True, slots=True)
class SpeechCall:
    model: str
    input: str
    response_format: str


def parse_speech(req: Any) -> SpeechCall:
    """Read the body as axum/serde do; raise :class:`Reject` where they refuse it."""
    if not isinstance(req, dict):
        raise Reject.shape("invalid type: expected a JSON object")
    model = req.get("model", "default")
    if not isinstance(model, str):
        raise Reject.shape("model: invalid type, expected a string")
    text = req.get("input")
    if not isinstance(text, str):
        raise Reject.shape("missing field `input`" if text is None else "input: invalid type")
    if "response_format" not in req:
        raise Reject.shape("missing field `response_format`")
    fmt = req["response_format"]
    if fmt not in FORMATS:
        expected = ", ".join(f"`{f}`" for f in FORMATS)
        raise Reject.shape(f"response_format: unknown variant `{fmt}`, expected one of {expected}")
    return SpeechCall(model, text, fmt)


def check_format(call: SpeechCall) -> None:
    """The handler's own check, after the model's."""
    if call.response_format not in ("wav", "pcm"):
        raise Reject.handler(422, "Only support wav/pcm response format.")


def _body_size(call: SpeechCall, knobs: SimKnobs) -> int:
    """The body's size in bytes (header included)."""
    frame = 2 * knobs.channels
    header = HEADER_BYTES if call.response_format == "wav" else 0
    if knobs.fault == "oversize":
        return OVERSIZE_BYTES
    if knobs.audio_bytes:
        return header + max(0, knobs.audio_bytes - header) // frame * frame
    ms = knobs.audio_ms or min(600_000, max(200, 60 * len(call.input)))
    return header + knobs.sample_rate * ms // 1000 * frame


def _blocks(call: SpeechCall, knobs: SimKnobs, size: int) -> Iterator[bytes]:
    fault = knobs.fault
    if call.response_format == "pcm":
        extra = 1 if fault == "odd_pcm" else 0
        return samples(size + extra, knobs.channels)
    data = size - HEADER_BYTES
    header = wav_header(
        data,
        knobs.sample_rate,
        knobs.channels,
        riff=b"RIFX" if fault == "bad_riff" else b"RIFF",
        format_tag=3 if fault == "not_pcm" else 1,
        declared_data=data + 2 if fault == "size_mismatch" else None,
    )
    return itertools.chain([header], samples(data, knobs.channels))


def check_fault_format(call: SpeechCall, knobs: SimKnobs) -> None:
    """A wav fault on pcm (or the pcm one on wav) would do nothing: refuse it."""
    fault = knobs.fault
    wav = call.response_format == "wav"
    if (fault in _WAV_FAULTS and not wav) or (fault == "odd_pcm" and wav):
        only = "pcm" if fault == "odd_pcm" else "wav"
        raise Reject(400, f"simulator: fault {fault!r} needs response_format {only}", as_json=False)


def plan_speech(call: SpeechCall, knobs: SimKnobs, request_id: str) -> Iterator[PlanStep]:
    fault = knobs.fault
    wav = call.response_format == "wav"
    size = _body_size(call, knobs)
    rate, channels = knobs.sample_rate, knobs.channels
    kind = "audio/wav" if wav else "audio/pcm; codecs=1; format=s16le"
    content_type = f"{kind}; rate={rate}; channels={channels}"
    length = size + (1 if fault == "odd_pcm" else 0)
    raw = RawBody(content_type, length, lambda: _blocks(call, knobs, size))
    delay = (knobs.first_delay_ms + knobs.delay_ms) / 1000
    env = Envelope(False, knobs, request_id, delay, lambda: b"", raw=raw, cut_body=True)
    return envelope(env)
