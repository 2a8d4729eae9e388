"""The worker's image answers, checked, and the caller's one answer. Pure.

One worker call answers ``{"created": <int>, "data": [{"url": null,
"b64_json": "data:image/png;base64,<PNG>"}]}`` (agents-media §1). Its source
(:class:`ImageBody`) holds the bytes as they arrive, bounded by what one
image may take (``images.max_bytes`` as base64, plus the data URL's prefix
and 64 KiB of envelope; past it the answer is refused and nothing more is
kept), and at the end finds the one ``"data:image/png;base64,…"`` string
without parsing the answer whole: exactly one must be there; the envelope
around it (that string replaced by a per-request token) is parsed, and the
token must be ``data[0].b64_json`` of a one-entry ``data``. The base64 is
then checked by :func:`~gateway.apis.images.png.check_png` (PNG signature,
IHDR size equal to the request's, CRC, ``IEND``, byte bound) in pieces.

:class:`ImagesDialect` reads every call of the request (one per image,
:meth:`ImagesDialect.next_call` between them) and assembles OpenAI's answer:
``{"created", "data": [{"b64_json": <bare base64>} | {"url": …}], "usage":
{"images": n}}``; the bare base64 goes out as views into the worker's own
bytes (:class:`~gateway.core.replies.Pieces`), never copied into one payload.
``url`` images are handed to the pipeline as :class:`~gateway.apis.base.OutputFile`
to store; their links come back in ``url``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.apis.base import OutputFile, Report
from gateway.apis.held import HeldBody
from gateway.apis.images.png import Png, check_png, decoded
from gateway.core.errors import GatewayError
from gateway.core.replies import Pieces
from gateway.core.sse import violation

PREFIX = b"data:image/png;base64,"
#: the answer's bytes besides the image's base64
ENVELOPE_BYTES = 65_536
_IMAGE = re.compile(rb'"data:image/png;base64,([A-Za-z0-9+/]*={0,2})"')


@dataclass(frozen=True, slots=True)
class ImageRequest:
    """What planning hands the dialect: the image asked for and how (how
    many is the plan's ``calls``)."""

    width: int
    height: int
    url: bool
    max_bytes: int


def answer_bound(max_bytes: int) -> int:
    """The most bytes one worker answer may hold for an image of ``max_bytes``."""
    return 4 * -(-max_bytes // 3) + len(PREFIX) + ENVELOPE_BYTES


@dataclass(slots=True)
class WorkerImage:
    """One call's answer: its ``created`` and where its base64 lies in ``raw``."""

    created: int
    raw: bytes
    start: int
    end: int

    @property
    def b64(self) -> memoryview:
        return memoryview(self.raw)[self.start : self.end]


class ImageBody(HeldBody):
    """One worker call's answer as a sans-I/O source: bytes in (bounded), one
    :class:`WorkerImage` out at the end, then :class:`~gateway.core.sse.Done`."""

    def __init__(self, max_bytes: int, token: str) -> None:
        super().__init__(max_bytes)
        self._token = token

    def _result(self) -> WorkerImage:
        return scan(super()._result(), self._token)


def scan(raw: bytes, token: str) -> WorkerImage:
    """The one image of a worker answer (module docstring), or a protocol error."""
    found = list(_IMAGE.finditer(raw))
    if len(found) != 1:
        raise violation("Upstream answer does not hold exactly one PNG data URL.")
    match = found[0]
    if len(raw) - (match.end() - match.start()) > ENVELOPE_BYTES:
        raise violation("Upstream answer exceeded the size limit.")
    envelope = raw[: match.start()] + orjson.dumps(token) + raw[match.end() :]
    try:
        parsed = orjson.loads(envelope)
    except orjson.JSONDecodeError:
        raise violation("Upstream answer is not valid JSON.") from None
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
        raise violation("Upstream answer does not hold exactly one image.")
    if data[0].get("b64_json") != token or data[0].get("url") is not None:
        raise violation("Upstream image is not where the answer puts it.")
    created = parsed.get("created")
    if type(created) is not int or created < 0:
        raise violation("Upstream answer's created is not a time.")
    return WorkerImage(created, raw, match.start(1), match.end(1))


class ImagesDialect:
    """Every call of one images request, read and checked; the one answer."""

    terminal_frame = b""
    usage_source = "reported"
    #: images are not content events: no first token (ttft) is measured
    has_content = False

    def __init__(self, request: ImageRequest, nonce: str) -> None:
        self._request = request
        self._token = f"image-{nonce}"
        self._bound = answer_bound(request.max_bytes)
        self._source = ImageBody(self._bound, self._token)
        self._images: list[tuple[WorkerImage, Png]] = []
        self._files: list[OutputFile] = []

    @property
    def source(self) -> ImageBody:
        return self._source

    def next_call(self) -> None:
        self._source = ImageBody(self._bound, self._token)

    def on_item(self, item: Any) -> bytes | None:
        request = self._request
        png = check_png(item.b64, request.width, request.height, request.max_bytes)
        self._images.append((item, png))
        if request.url:
            # Decoded again as the file is written: never whole beside the base64.
            name = f"image-{len(self._images)}.png"
            self._files.append(OutputFile(decoded(item.b64), name))
        return None

    def error_frame(self, exc: GatewayError) -> bytes:
        raise AssertionError("an images answer is never streamed")

    def report(self) -> Report:
        images = [png for _, png in self._images]
        return Report(
            outputs=[
                {"sha256": p.sha256, "bytes": p.size, "width": p.width, "height": p.height}
                for p in images
            ],
            media_usage={"images": len(images)},
            files=tuple(self._files),
        )

    def answer(self, usage: dict[str, Any]) -> Pieces:
        """OpenAI's answer; ``url`` links must have been filled in by then."""
        images = self._images
        created = images[0][0].created if images else 0
        pieces: list[bytes | memoryview] = [b'{"created":%d,"data":[' % created]
        for index, (image, _) in enumerate(images):
            comma = b"," if index else b""
            if self._request.url:
                url = self._files[index].url
                assert url is not None, "the pipeline stores url images before the answer"
                pieces.append(comma + orjson.dumps({"url": url}))
            else:
                pieces += [comma + b'{"b64_json":"', image.b64, b'"}']
        pieces.append(b'],"usage":{"images":%d}}' % len(images))
        return Pieces(b"application/json", tuple(pieces))
