"""The worker's image answers as the dialect reads them (spec §23): exactly one PNG
data URL of the asked size, bounded as it arrives, checked in pieces; the
caller's one OpenAI-shaped answer with bare base64 (or links) for every call."""

from __future__ import annotations

import base64
import gc
import random
import tracemalloc
from typing import Any

import orjson
import pytest

from gateway.apis.images.answer import ImageRequest, ImagesDialect, answer_bound
from gateway.apis.images.png import check_png, decoded
from gateway.core.errors import GatewayError
from gateway.core.replies import Pieces
from gateway.core.sse import NEED_DATA, Done
from tests.support.media import chunk, image_answer, png

NONCE = "0123456789abcdef"


def request(width: int = 64, height: int = 64, *, url: bool = False) -> ImageRequest:
    return ImageRequest(width, height, url, 16_777_216)


def feed(dialect: ImagesDialect, data: bytes, pieces: list[bytes] | None = None) -> None:
    """One worker call's bytes through the dialect's source, as the relay feeds them."""
    source = dialect.source
    for piece in pieces if pieces is not None else [data]:
        source.receive_data(piece)
        assert source.next_event() is NEED_DATA
    source.receive_data(b"")
    item = source.next_event()
    assert not isinstance(item, Done)
    dialect.on_item(item)
    assert isinstance(source.next_event(), Done)


def joined(answer: Pieces) -> dict[str, Any]:
    assert answer.media_type == b"application/json"
    body = b"".join(bytes(piece) for piece in answer.pieces)
    assert len(body) == answer.size
    parsed: dict[str, Any] = orjson.loads(body)
    return parsed


def refused(data: bytes, req: ImageRequest | None = None) -> GatewayError:
    dialect = ImagesDialect(req or request(), NONCE)
    with pytest.raises(GatewayError) as caught:
        feed(dialect, data)
    return caught.value


def test_one_image_becomes_openais_shape_with_bare_base64() -> None:
    image = png(64, 64)
    dialect = ImagesDialect(request(), NONCE)
    feed(dialect, image_answer(image, created=1234))
    answer = joined(dialect.answer({}))
    assert answer == {
        "created": 1234,
        "data": [{"b64_json": base64.b64encode(image).decode()}],
        "usage": {"images": 1},
    }
    report = dialect.report()
    assert report.media_usage == {"images": 1}
    assert report.outputs is not None and report.outputs[0]["bytes"] == len(image)
    assert (report.outputs[0]["width"], report.outputs[0]["height"]) == (64, 64)
    assert dialect.has_content is False and not report.files


def test_the_base64_goes_out_as_the_workers_own_bytes() -> None:
    dialect = ImagesDialect(request(), NONCE)
    feed(dialect, image_answer(png(64, 64)))
    views = [p for p in dialect.answer({}).pieces if isinstance(p, memoryview)]
    assert len(views) == 1 and views[0].obj is not None  # a view, never a copy


def test_several_calls_make_one_answer_in_order() -> None:
    images = [png(64, 128, pad=i) for i in range(3)]
    dialect = ImagesDialect(request(64, 128), NONCE)
    for index, image in enumerate(images):
        if index:
            dialect.next_call()
        feed(dialect, image_answer(image, created=100 + index))
    answer = joined(dialect.answer({}))
    assert answer["created"] == 100
    assert [base64.b64decode(d["b64_json"]) for d in answer["data"]] == images
    assert answer["usage"] == {"images": 3}
    outputs = dialect.report().outputs
    assert outputs is not None and [o["bytes"] for o in outputs] == [len(i) for i in images]


def test_url_images_are_handed_over_as_files_and_answered_with_their_links() -> None:
    image = png(64, 64)
    dialect = ImagesDialect(request(url=True), NONCE)
    feed(dialect, image_answer(image))
    dialect.next_call()
    feed(dialect, image_answer(image))
    files = dialect.report().files
    assert [f.name for f in files] == ["image-1.png", "image-2.png"]
    pieces = [f.data for f in files]
    assert all(not isinstance(p, bytes) for p in pieces)  # decoded as the file is written
    assert [b"".join(p) for p in pieces if not isinstance(p, bytes)] == [image] * 2
    for index, output in enumerate(files):
        output.url = f"https://gw/v1/files/file_{index}/content?sig=s&exp=1"
    answer = joined(dialect.answer({}))
    assert answer["data"] == [{"url": f.url} for f in files]


@pytest.mark.parametrize("seed", range(5))
def test_any_split_of_the_bytes_reads_the_same(seed: int) -> None:
    data = image_answer(png(64, 64, pad=3000))
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), 20))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    dialect = ImagesDialect(request(), NONCE)
    feed(dialect, data, pieces)
    reference = ImagesDialect(request(), NONCE)
    feed(reference, data)
    assert joined(dialect.answer({})) == joined(reference.answer({}))


def _bad_crc(image: bytes) -> bytes:
    return image[:29] + bytes([image[29] ^ 0xFF]) + image[30:]


def _two(image: bytes) -> bytes:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    entry = {"url": None, "b64_json": url}
    return orjson.dumps({"created": 1, "data": [entry, entry]})


def _answer(**fields: Any) -> bytes:
    url = "data:image/png;base64," + base64.b64encode(png(64, 64)).decode()
    body: dict[str, Any] = {"created": 1, "data": [{"url": None, "b64_json": url}]}
    body.update(fields)
    return orjson.dumps(body)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(image_answer(png(80, 64)), id="wrong_width"),
        pytest.param(image_answer(png(64, 80)), id="wrong_height"),
        pytest.param(image_answer(b"\x89PNX" + png(64, 64)[4:]), id="bad_signature"),
        pytest.param(image_answer(_bad_crc(png(64, 64))), id="bad_crc"),
        pytest.param(image_answer(png(64, 64)[:-12]), id="no_iend"),
        pytest.param(image_answer(b"GIF89a" + b"\x00" * 40), id="not_png"),
        pytest.param(_two(png(64, 64)), id="two_images"),
        pytest.param(orjson.dumps({"created": 1, "data": []}), id="no_image"),
        pytest.param(
            orjson.dumps({"created": 1, "data": [{"b64_json": "iVBORw0KGgo="}]}), id="bare_base64"
        ),
        pytest.param(image_answer(png(64, 64)).replace(b"base64,", b"base64,!!"), id="bad_b64"),
        pytest.param(image_answer(png(64, 64)).replace(b'"}]}', b'A"}]}'), id="bad_length"),
        pytest.param(image_answer(png(64, 64)).replace(b"base64,iVBO", b"base64,iV=="), id="pad"),
        pytest.param(_answer(created="now"), id="created_text"),
        pytest.param(_answer(created=-1), id="created_negative"),
        pytest.param(_answer(data={"x": 1}), id="data_object"),
        pytest.param(image_answer(png(64, 64))[:-1], id="cut_json"),
        pytest.param(b"not json " + image_answer(png(64, 64)), id="not_json"),
        pytest.param(
            orjson.dumps({"created": 1, "data": [{"url": "image-1.png", "b64_json": None}]}),
            id="url_answer",
        ),
    ],
)
def test_every_broken_answer_is_a_protocol_error(data: bytes) -> None:
    error = refused(data)
    assert (error.code, error.status) == ("upstream_protocol_error", 502)


def test_a_data_url_outside_data_0_is_refused() -> None:
    image = png(64, 64)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    # The only data URL, but in `url`, with b64_json naming nothing.
    moved = orjson.dumps({"created": 1, "data": [{"url": url, "b64_json": None}]})
    assert refused(moved).code == "upstream_protocol_error"
    nested = orjson.dumps({"created": 1, "extra": url, "data": [{"url": None}]})
    assert refused(nested).code == "upstream_protocol_error"


def test_an_answer_over_its_bound_is_refused_as_it_arrives() -> None:
    req = ImageRequest(64, 64, False, 1000)
    dialect = ImagesDialect(req, NONCE)
    source = dialect.source
    big = b"x" * (answer_bound(1000) + 1)
    source.receive_data(big)
    with pytest.raises(GatewayError) as caught:
        source.next_event()
    assert caught.value.code == "upstream_protocol_error"
    # Nothing more is kept once refused.
    source.receive_data(b"y" * 1000)
    assert source.bytes_received == len(big) + 1000


def test_an_image_over_max_bytes_is_refused_before_decoding() -> None:
    image = png(64, 64, pad=5000)
    req = ImageRequest(64, 64, False, len(image) - 1)
    assert refused(image_answer(image), req).code == "upstream_protocol_error"
    exact = ImageRequest(64, 64, False, len(image))
    dialect = ImagesDialect(exact, NONCE)
    feed(dialect, image_answer(image))


def test_check_png_reads_the_image_and_decoded_gives_its_bytes_in_pieces() -> None:
    image = png(64, 64, pad=2_000_000)
    b64 = memoryview(base64.b64encode(image))
    checked = check_png(b64, 64, 64, 10**7)
    assert (checked.size, checked.width, checked.height) == (len(image), 64, 64)
    pieces = list(decoded(b64))
    assert len(pieces) == 3 and b"".join(pieces) == image


def test_a_png_whose_first_chunk_is_not_ihdr_is_refused() -> None:
    image = png(64, 64)
    swapped = image[:8] + chunk(b"teXt", b"x" * 13) + image[8:]
    assert refused(image_answer(swapped)).code == "upstream_protocol_error"


def test_a_16_mib_image_is_checked_in_bounded_memory() -> None:
    """The answer is held once (as its base64); checking it adds little."""
    image = png(64, 64, pad=16 * 1024 * 1024 - 200)
    data = image_answer(image)
    dialect = ImagesDialect(request(), NONCE)
    gc.collect()
    tracemalloc.start()
    try:
        source = dialect.source
        for at in range(0, len(data), 65_536):
            source.receive_data(data[at : at + 65_536])
        source.receive_data(b"")
        dialect.on_item(source.next_event())
        answer = dialect.answer({})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.size > len(image)
    # The held answer (4/3 of the image) plus its envelope parse and a few pieces.
    assert peak < 1.6 * len(image), peak
