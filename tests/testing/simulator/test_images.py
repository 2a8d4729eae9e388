"""``POST /v1/images/generations``: real PNGs, the worker's request rules, faults."""

from __future__ import annotations

import base64
import gzip
import json
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.testing.simulator import IMAGES_FAULTS, Simulator
from gateway.testing.simulator.png import ihdr_size, solid_png
from tests.testing.simulator.wire import Raw, exchange, http_request, parse

CHAT = "/m/chat"
IMAGE = "/m/image"
SPEECH = "/m/speech"
IMAGES = "/v1/images/generations"


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    simulator = Simulator(model_ids=[CHAT, (IMAGE, "image"), (SPEECH, "speech")], id_seed=11)
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def client(sim: Simulator) -> Iterator[httpx.Client]:
    sim.reset()
    with httpx.Client(base_url=sim.base_url, timeout=10) as c:
        yield c


def request(prompt: str = "a cat", **extra: Any) -> dict[str, Any]:
    return {"model": IMAGE, "prompt": prompt, "response_format": "B64Json", **extra}


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """Every chunk of a PNG, each CRC checked; raises on anything malformed."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "signature"
    chunks: list[tuple[bytes, bytes]] = []
    pos = 8
    while pos < len(data):  # bounded: pos grows by at least 12 each pass
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body), f"CRC of {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    return chunks


def decoded_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, raw scanlines) of an 8-bit RGB PNG, fully checked."""
    chunks = png_chunks(data)
    width, height, depth, colour, *_ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour) == (8, 2)
    pixels = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    assert len(pixels) == height * (1 + 3 * width)
    return width, height, pixels


def image_of(body: dict[str, Any]) -> bytes:
    (entry,) = body["data"]
    assert list(entry) == ["url", "b64_json"] and entry["url"] is None
    prefix = "data:image/png;base64,"
    assert entry["b64_json"].startswith(prefix)
    return base64.b64decode(entry["b64_json"][len(prefix) :], validate=True)


# ---------------------------------------------------------------- answers


def test_b64json_is_a_real_png_of_the_requested_size(client: httpx.Client) -> None:
    response = client.post(IMAGES, json=request(width=1536, height=1536))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["created", "data"] and isinstance(body["created"], int)
    width, height, pixels = decoded_png(image_of(body))
    assert (width, height) == (1536, 1536)
    assert len(response.content) < 64 * 1024  # one colour: compresses well
    first_row = pixels[: 1 + 3 * width]
    assert first_row[0] == 0 and len(set(first_row[1:])) <= 3
    again = client.post(IMAGES, json=request(width=1536, height=1536)).json()
    assert again == body  # deterministic
    other = image_of(client.post(IMAGES, json=request("a dog", width=64, height=64)).json())
    assert decoded_png(other)[2][1:4] != first_row[1:4]  # the colour follows the prompt


def test_defaults_n_and_the_recorded_body(sim: Simulator, client: httpx.Client) -> None:
    body = client.post(
        IMAGES, json={"model": IMAGE, "prompt": "x", "response_format": "B64Json", "n": 3}
    )
    assert ihdr_size(image_of(body.json())) == (1280, 720)  # width 1280, height 720; n ignored
    client.post(IMAGES, json=request(width=512, height=256))
    sent = [r.json for r in sim.requests()]
    assert sent[1] == {
        "model": IMAGE,
        "prompt": "a cat",
        "response_format": "B64Json",
        "width": 512,
        "height": 256,
    }
    assert [r.model for r in sim.requests()] == [IMAGE, IMAGE]


def test_url_names_a_file_it_never_writes(client: httpx.Client, tmp_path: Path) -> None:
    before = set(Path.cwd().glob("image-generation-*.png"))
    body = client.post(IMAGES, json={"model": IMAGE, "prompt": "x"}).json()  # "Url" by default
    (entry,) = body["data"]
    assert entry["b64_json"] is None
    assert re.fullmatch(
        r"image-generation-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.png",
        entry["url"],
    )
    assert set(Path.cwd().glob("image-generation-*.png")) == before
    second = client.post(IMAGES, json={"model": IMAGE, "prompt": "x"}).json()
    assert second["data"][0]["url"] != entry["url"]


def test_the_worker_request_rules(sim: Simulator, client: httpx.Client) -> None:
    for value in ("url", "b64_json", None, 3):
        refused = client.post(IMAGES, json=request(response_format=value))
        assert refused.status_code == 422, value
        assert refused.headers["content-type"].startswith("text/plain")
        assert refused.text.startswith("Failed to deserialize the JSON body into the target type: ")
    assert (
        "unknown variant `url`, expected `Url` or `B64Json`"
        in client.post(IMAGES, json=request(response_format="url")).text
    )
    assert client.post(IMAGES, json={"model": IMAGE}).status_code == 422  # prompt is required
    assert client.post(IMAGES, json=request(width=-1)).status_code == 422
    assert client.post(IMAGES, json=request(height=None)).status_code == 422
    unknown = client.post(IMAGES, json=request(model="/m/none"))
    assert unknown.status_code == 500 and "is not available" in unknown.json()["message"]
    for model in (CHAT, SPEECH):
        other = client.post(IMAGES, json=request(model=model))
        assert other.status_code == 422
        assert other.json() == {
            "message": "Received a request incompatible for this model's category."
        }
    big = client.post(IMAGES, json=request(width=8192, height=4096))
    assert big.status_code == 400 and big.text.startswith("simulator: image 8192x4096")
    assert client.get(IMAGES).status_code == 405
    assert client.post(IMAGES, json=request("[[sim fault=hang_mid]]")).status_code == 400
    failed = client.post(IMAGES, json=request("[[sim status=422]]"))
    assert (failed.status_code, failed.json()) == (422, {"message": "simulated failure"})


def test_image_bytes_pads_a_still_valid_png(client: httpx.Client) -> None:
    data = image_of(
        client.post(IMAGES, json=request("[[sim image_bytes=200000]]", width=64, height=64)).json()
    )
    assert len(data) == 200_000
    assert decoded_png(data)[:2] == (64, 64)
    assert [kind for kind, _ in png_chunks(data)] == [b"IHDR", b"IDAT", b"siMp", b"IEND"]


def test_solid_png_is_bounded() -> None:
    with pytest.raises(ValueError, match="bound"):
        solid_png(4097, 4096, b"abc")
    assert ihdr_size(solid_png(3, 2, b"abc")) == (3, 2)


# ------------------------------------------------------------------ faults


def _b64(raw: Raw) -> str:
    entry: str = json.loads(raw.body)["data"][0]["b64_json"]
    return entry


def _png(raw: Raw) -> bytes:
    return image_of(json.loads(raw.body))


def _bad_png(raw: Raw) -> bool:
    try:
        png_chunks(_png(raw))
    except AssertionError:
        return True
    return False


FAULT_CHECKS: dict[str, Callable[[Raw], bool]] = {
    "bad_signature": lambda r: _png(r)[:8] == b"\x89PNX\r\n\x1a\n" and _bad_png(r),
    "bad_crc": lambda r: _png(r)[:8] == b"\x89PNG\r\n\x1a\n" and _bad_png(r),
    "wrong_size": lambda r: decoded_png(_png(r))[:2] == (80, 48),
    "not_data_url": lambda r: decoded_png(base64.b64decode(_b64(r)))[:2] == (64, 48),
    "bad_base64": lambda r: _b64(r).startswith("data:image/png;base64,") and "!!" in _b64(r),
    "two_images": lambda r: len(json.loads(r.body)["data"]) == 2,
    "no_image": lambda r: json.loads(r.body)["data"] == [],
    "oversize": lambda r: (
        len(_png(r)) == 16 * 1024 * 1024 + 1 and decoded_png(_png(r))[:2] == (64, 48)
    ),
    "close_mid": lambda r: (
        r.status == 200
        and not r.terminated
        and 0 < len(r.body) < int(r.header("content-length") or 0)
    ),
    "hang": lambda r: r.head_bytes == 0 and r.ending == "timeout",
    "hang_headers": lambda r: r.head_bytes == 0 and r.ending == "timeout",
    "redirect": lambda r: r.status == 307 and r.header("location") == "/sim/redirected",
    "huge_headers": lambda r: r.head_bytes > 200 * 1024 and decoded_png(_png(r))[:2] == (64, 48),
    "wrong_request_id": lambda r: r.header("x-request-id") not in (None, "mine-1"),
    "no_request_id": lambda r: r.header("x-request-id") is None,
    "wrong_content_type": lambda r: r.header("content-type") == "text/plain; charset=utf-8",
    "gzip": lambda r: (
        r.header("content-encoding") == "gzip"
        and json.loads(gzip.decompress(r.body))["data"][0]["b64_json"].startswith("data:")
    ),
}


def test_every_images_fault_has_a_check() -> None:
    assert set(FAULT_CHECKS) == IMAGES_FAULTS


@pytest.mark.parametrize("fault", sorted(FAULT_CHECKS))
def test_images_fault_produces_its_bytes(sim: Simulator, fault: str) -> None:
    sim.reset()
    body = request(f"[[sim fault={fault}]]", width=64, height=48)
    sent = http_request(IMAGES, body, headers={"x-request-id": "mine-1"})
    timeout = 0.5 if "hang" in fault else 10.0
    raw = parse(
        exchange(sim.port, sent, timeout, limit=64 << 20), "timeout" if "hang" in fault else "eof"
    )
    assert FAULT_CHECKS[fault](raw), (raw.status, raw.headers, raw.body[:200])
