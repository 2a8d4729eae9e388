"""``POST /v1/images/generations`` as a ``serve diffusion`` worker answers it
(reference §13 → agents-media §1). Pure.

Request (``ImageGenerationRequest``; unknown keys ignored, ``null`` is a type
error as serde reads these fields): ``model`` (default ``"default"``),
``prompt`` required, ``n`` (usize, default 1; read and ignored: one image
always), ``response_format`` exactly ``"Url"`` or ``"B64Json"`` (default
``"Url"``; OpenAI's ``url``/``b64_json`` are axum's 422 text),
``height``/``width`` (usize, defaults 720 and 1280). Then the model (unknown:
500 ``{"message"}``; a route of another kind: 422 with the engine's category
message). Directives: ``[[sim ...]]`` in the prompt.

Answer, in serde's key order: ``{"created": <the simulator's start second>,
"data": [{"url": ..., "b64_json": ...}]}``, both keys always present:

* ``B64Json``: ``b64_json`` is a data URL ``data:image/png;base64,<PNG>`` of a
  real PNG exactly ``width`` x ``height`` (png.py: one solid colour taken from
  the prompt's SHA-256, padded to ``image_bytes`` when that knob is set);
* ``Url``: ``url`` is the filename ``image-generation-<uuid>.png``. The real
  worker writes that PNG into its own working directory (and never deletes
  it); the simulator writes nothing anywhere, test equipment must not fill a
  disk, and the name is all a client ever gets.

The simulator bounds the image at 4096 x 4096 pixels and 16384 a side (the
worker has no bound): a larger request is 400 ``simulator: ...``. The answer
comes after ``first_delay_ms + delay_ms``.

Faults (``IMAGES_FAULTS``): ``bad_signature`` (the PNG's first bytes are not
the signature), ``bad_crc`` (IHDR's CRC is wrong), ``wrong_size`` (a valid PNG
16 pixels wider than asked), ``not_data_url`` (bare base64, OpenAI's shape),
``bad_base64`` (the data URL's base64 is broken), ``two_images`` (two entries
in ``data``), ``no_image`` (``data: []``), ``oversize`` (the PNG padded past
16 MiB, the gateway's default bound), ``close_mid`` (the head, half the body,
then the cut), and the envelope's ``hang``, ``hang_headers``, ``redirect``,
``huge_headers``, ``wrong_request_id``, ``no_request_id``,
``wrong_content_type``, ``gzip``; the ``status`` knob answers that status with
``{"message":"simulated failure"}`` (422 and 500 are the worker's own).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import Envelope, PlanStep, Reject, dump, envelope, sim_uuid
from gateway.testing.simulator.png import MAX_PIXELS, MAX_SIDE, solid_png

FORMATS = ("Url", "B64Json")
OVERSIZE_BYTES = 16 * 1024 * 1024 + 1
_URL_KIND = 0x500


@dataclass(frozen=True, slots=True)
class ImageCall:
    model: str
    prompt: str
    response_format: str
    width: int
    height: int


def _usize(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_image(req: Any) -> ImageCall:
    """Read the body as axum/serde do; raise :class:`Reject` where they refuse it."""
    if not isinstance(req, dict):
        raise Reject.shape("invalid type: expected a JSON object")
    model = req.get("model", "default")
    if not isinstance(model, str):
        raise Reject.shape("model: invalid type, expected a string")
    prompt = req.get("prompt")
    if not isinstance(prompt, str):
        raise Reject.shape("missing field `prompt`" if prompt is None else "prompt: invalid type")
    for key in ("n", "height", "width"):
        if key in req and not _usize(req[key]):
            raise Reject.shape(f"{key}: invalid type, expected usize")
    response_format = req.get("response_format", "Url")
    if response_format not in FORMATS:
        raise Reject.shape(
            f"response_format: unknown variant `{response_format}`, expected `Url` or `B64Json`"
        )
    return ImageCall(model, prompt, response_format, req.get("width", 1280), req.get("height", 720))


def check_size(call: ImageCall) -> str | None:
    """The simulator's own bound (the worker has none): a message, or None when it fits."""
    w, h = call.width, call.height
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE and w * h <= MAX_PIXELS):
        return (
            f"simulator: image {w}x{h} is over the simulator's bound "
            f"(1..{MAX_SIDE} a side, {MAX_PIXELS} pixels)"
        )
    return None


def _png(call: ImageCall, knobs: SimKnobs) -> bytes:
    fault = knobs.fault
    rgb = hashlib.sha256(call.prompt.encode()).digest()[:3]
    width = call.width
    if fault == "wrong_size":
        wider = width + 16
        fits = wider <= MAX_SIDE and wider * call.height <= MAX_PIXELS
        width = wider if fits else width - 16
    pad = OVERSIZE_BYTES if fault == "oversize" else knobs.image_bytes
    data = solid_png(width, call.height, rgb, min_bytes=pad)
    if fault == "bad_signature":
        data = b"\x89PNX\r\n\x1a\n" + data[8:]
    elif fault == "bad_crc":
        data = data[:29] + bytes([data[29] ^ 0xFF]) + data[30:]  # IHDR's CRC: bytes 29..32
    return data


def _entry(call: ImageCall, knobs: SimKnobs, seed: int, number: int) -> dict[str, Any]:
    if call.response_format == "Url":
        # A name only: the real worker saves the PNG under it in its cwd; see the docstring.
        name = f"image-generation-{sim_uuid(seed, number, _URL_KIND)}.png"
        return {"url": name, "b64_json": None}
    encoded = base64.b64encode(_png(call, knobs)).decode("ascii")
    if knobs.fault == "bad_base64":
        encoded = encoded[:8] + "!!" + encoded[8:]
    if knobs.fault == "not_data_url":
        return {"url": None, "b64_json": encoded}
    return {"url": None, "b64_json": "data:image/png;base64," + encoded}


def plan_image(
    call: ImageCall, knobs: SimKnobs, seed: int, number: int, created: int, request_id: str
) -> Iterator[PlanStep]:
    def json_body() -> bytes:
        entry = _entry(call, knobs, seed, number)
        data = {"no_image": [], "two_images": [entry, entry]}.get(knobs.fault or "", [entry])
        return dump({"created": created, "data": data})

    delay = (knobs.first_delay_ms + knobs.delay_ms) / 1000
    return envelope(Envelope(False, knobs, request_id, delay, json_body, cut_body=True))
