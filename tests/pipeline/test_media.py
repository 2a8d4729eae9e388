"""A request's media in the pipeline: records leased before the permit, inline
data staged after it, the forwarded body's layout (data: or file:// URLs, its
exact size) and the receipt's artifacts."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from gateway.apis.base import MediaRef, Plan
from gateway.books.receipts import Receipt
from gateway.config import StagingConfig
from gateway.core.body import Layout, MediaSlot, placeholder
from gateway.core.errors import GatewayError
from gateway.pipeline.media import (
    body_layout,
    lease_records,
    record_artifacts,
    refill,
    stage_inline,
)
from tests.pipeline.support import (
    NONCE,
    ROUTE,
    FakeMedia,
    chat_plan,
    make_call,
    make_tenant,
    record,
    route_call,
    routed_of,
)

PNG = record("ev_png", "image/png", 10, ext="png", locator="aa" * 32)
WAV = record("ev_wav", "audio/wav", 7, ext="wav")
DATA_URL = "data:image/png;base64," + base64.b64encode(b"\x89PNG1234").decode()
DATA_STAGED = record("ev_inline", "image/png", 8, ext="png")
DATA_MODES = StagingConfig(worker_media="data_url")
FILE_MODES = StagingConfig(worker_media="file_url", worker_url_prefix="file:///srv/evidence")


def _evidence(slot: int, evidence_id: str, kind: Any = "image") -> MediaRef:
    return MediaRef(slot, slot, kind, "evidence", evidence_id)


def _inline(slot: int, url: str = DATA_URL, size: int = 8, kind: Any = "image") -> MediaRef:
    return MediaRef(slot, slot, kind, "data", data_url=url, inline_bytes=size)


def _plan(*refs: MediaRef) -> Plan:
    plan = chat_plan()
    plan.media = list(refs)
    return plan


def _forward(plan: Plan) -> dict[str, Any]:
    parts = [
        {"type": f"{ref.kind}_url", f"{ref.kind}_url": {"url": placeholder(NONCE, ref.slot)}}
        for ref in plan.media
    ]
    return {
        "model": ROUTE,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}],
        "stream": True,
    }


def _render(body: Layout) -> dict[str, Any]:
    """The bytes the worker would get, each data: slot filled with base64 of
    its declared size (what the encoder produces), parsed back."""
    out = b""
    for segment in body.segments:
        if isinstance(segment, MediaSlot):
            out += segment.prefix + b"A" * (4 * -(-segment.raw_bytes // 3)) + b'"'
        else:
            out += segment
    assert len(out) == body.size
    parsed: dict[str, Any] = orjson.loads(out)
    return parsed


def _slots(body: Layout) -> list[MediaSlot]:
    return [s for s in body.segments if isinstance(s, MediaSlot)]


# -- body_layout ------------------------------------------------------------------


def test_a_body_without_media_is_one_segment_of_its_json() -> None:
    plan = _plan()
    forward = _forward(plan)
    body = body_layout(forward, plan, {}, DATA_MODES)
    assert body.segments == (orjson.dumps(forward),)
    assert body.size == len(orjson.dumps(forward)) and not body.media


def test_data_url_mode_puts_a_slot_per_record() -> None:
    plan = _plan(_evidence(0, "ev_png"), _evidence(1, "ev_wav", "audio"))
    body = body_layout(_forward(plan), plan, {0: PNG, 1: WAV}, DATA_MODES)
    assert _slots(body) == [
        MediaSlot("image/png", 10, PNG.sha256, "png"),
        MediaSlot("audio/wav", 7, WAV.sha256, "wav"),
    ]
    urls = [_url(part) for part in _render(body)["messages"][0]["content"][1:]]
    assert urls[0].startswith("data:image/png;base64,") and urls[1].startswith("data:audio/wav")
    assert body.media


def _url(part: dict[str, Any]) -> str:
    url: str = part[part["type"]]["url"]
    return url


def test_the_layout_size_is_exact_before_any_media_byte() -> None:
    plan = _plan(_evidence(0, "ev_png"), _inline(1, size=8), _evidence(2, "ev_wav", "audio"))
    body = body_layout(_forward(plan), plan, {0: PNG, 2: WAV}, DATA_MODES)
    # _render checks that the filled body has exactly the announced size.
    rendered = _render(body)
    assert rendered["model"] == ROUTE
    # base64 of 10, 8 and 7 bytes: 16, 12 and 12 characters.
    lengths = [len(_url(p).partition(",")[2]) for p in rendered["messages"][0]["content"][1:]]
    assert lengths == [16, 12, 12]


def test_file_url_mode_names_each_record_by_digest() -> None:
    plan = _plan(_evidence(0, "ev_png"), _evidence(1, "ev_wav", "audio"))
    body = body_layout(_forward(plan), plan, {0: PNG, 1: WAV}, FILE_MODES)
    assert not body.media
    content = _render(body)["messages"][0]["content"]
    assert [_url(p) for p in content[1:]] == [
        f"file:///srv/evidence/{PNG.sha256}.png",
        f"file:///srv/evidence/{WAV.sha256}.wav",
    ]


@pytest.mark.parametrize("staging", [DATA_MODES, FILE_MODES], ids=["data_url", "file_url"])
def test_inline_data_not_staged_yet_stands_in_by_its_declared_type(
    staging: StagingConfig,
) -> None:
    plan = _plan(_inline(0, size=8))
    body = body_layout(_forward(plan), plan, {}, staging)
    # In both modes: its size is checked as a data: URL before it is staged.
    assert _slots(body) == [MediaSlot("image/png", 8, "0" * 64, "bin")]


def test_inline_data_without_a_declared_type_counts_as_octet_stream() -> None:
    url = "data:;base64," + base64.b64encode(b"abc").decode()
    plan = _plan(_inline(0, url, 3))
    body = body_layout(_forward(plan), plan, {}, DATA_MODES)
    assert _slots(body) == [MediaSlot("application/octet-stream", 3, "0" * 64, "bin")]


def test_inline_data_once_staged_is_laid_out_like_evidence() -> None:
    plan = _plan(_inline(0))
    before = body_layout(_forward(plan), plan, {}, FILE_MODES)
    after = body_layout(_forward(plan), plan, {0: DATA_STAGED}, FILE_MODES)
    assert before.media and not after.media
    assert _url(_render(after)["messages"][0]["content"][1]).endswith(f"/{DATA_STAGED.sha256}.png")


def test_a_refilled_layout_equals_one_laid_out_afresh() -> None:
    """Staging inline data refills the slots of the layout made before the
    permit: the same segments and size as laying the body out again."""
    plan = _plan(_evidence(0, "ev_png"), _inline(1), _inline(2, size=300))
    before = body_layout(_forward(plan), plan, {0: PNG}, DATA_MODES)
    staged = {0: PNG, 1: DATA_STAGED, 2: WAV}
    again = body_layout(_forward(plan), plan, staged, DATA_MODES)
    refilled = refill(before, plan, staged, DATA_MODES)
    assert refilled == again and refilled.size != before.size
    assert _render(refilled) == _render(again)


def test_a_repeated_record_fills_every_slot_it_is_named_in() -> None:
    plan = _plan(_evidence(0, "ev_png"), _evidence(1, "ev_png"))
    body = body_layout(_forward(plan), plan, {0: PNG, 1: PNG}, DATA_MODES)
    slot = MediaSlot("image/png", 10, PNG.sha256, "png")
    assert _slots(body) == [slot, slot]
    content = _render(body)["messages"][0]["content"][1:]
    assert _url(content[0]) == _url(content[1])


# -- record_artifacts -----------------------------------------------------------------


def _receipt() -> Receipt:
    return Receipt(
        request_id="r", tenant="acme", subject="s", endpoint="chat.completions", serve_identity=None
    )


def test_artifacts_follow_request_order_with_a_repeated_id_once_per_part() -> None:
    plan = _plan(_evidence(0, "ev_wav", "audio"), _evidence(1, "ev_png"), _evidence(2, "ev_wav"))
    receipt = _receipt()
    record_artifacts(receipt, plan, {0: WAV, 1: PNG, 2: WAV})
    assert [a["evidence_id"] for a in receipt.artifacts] == ["ev_wav", "ev_png", "ev_wav"]
    assert receipt.artifacts[1] == {
        "evidence_id": "ev_png",
        "sha256": PNG.sha256,
        "media_type": "image/png",
    }
    assert receipt.locator_sha256 == [None, "aa" * 32, None]


def test_artifacts_skip_parts_without_a_record() -> None:
    plan = _plan(_inline(0), _evidence(1, "ev_png"))
    receipt = _receipt()
    record_artifacts(receipt, plan, {1: PNG})
    assert [a["evidence_id"] for a in receipt.artifacts] == ["ev_png"]
    assert receipt.locator_sha256 == ["aa" * 32]


def test_artifacts_without_a_plan_leave_the_receipt_alone() -> None:
    receipt = _receipt()
    receipt.artifacts = [{"evidence_id": "kept"}]
    record_artifacts(receipt, None, {0: PNG})
    assert receipt.artifacts == [{"evidence_id": "kept"}] and receipt.locator_sha256 == []


# -- lease_records and stage_inline ---------------------------------------------------


async def test_lease_records_leases_each_id_once_and_fills_every_slot() -> None:
    media = FakeMedia([PNG, WAV])
    call = make_call(media=media)
    plan = _plan(_evidence(0, "ev_png"), _evidence(1, "ev_wav", "audio"), _evidence(2, "ev_png"))
    await lease_records(call, route_call(call), plan, "messages")
    assert media.events == [("lease", ["ev_png", "ev_wav"])]
    assert routed_of(call).records == {0: PNG, 1: WAV, 2: PNG}


async def test_lease_records_without_evidence_touches_no_catalog() -> None:
    media = FakeMedia()
    call = make_call(media=media)
    await lease_records(call, route_call(call), _plan(_inline(0)), "messages")
    assert media.events == [] and routed_of(call).records == {}


async def test_a_record_of_another_kind_is_refused_naming_the_param() -> None:
    call = make_call(media=FakeMedia([WAV]))
    with pytest.raises(GatewayError) as caught:
        await lease_records(call, route_call(call), _plan(_evidence(0, "ev_wav", "image")), "input")
    assert (caught.value.code, caught.value.param) == ("modality_not_allowed", "input")
    assert routed_of(call).records == {}


async def test_a_modality_the_policy_dropped_since_planning_is_refused() -> None:
    call = make_call(media=FakeMedia([WAV]), tenant=make_tenant(modalities=["text", "image"]))
    with pytest.raises(GatewayError, match="modality_not_allowed"):
        await lease_records(
            call, route_call(call), _plan(_evidence(0, "ev_wav", "audio")), "messages"
        )


async def test_a_repeated_id_counts_against_the_byte_limit_each_time() -> None:
    tenant = make_tenant(max_media_bytes=15)
    once = make_call(media=FakeMedia([PNG]), tenant=tenant)
    await lease_records(once, route_call(once), _plan(_evidence(0, "ev_png")), "messages")
    twice = make_call(media=FakeMedia([PNG]), tenant=tenant)
    with pytest.raises(GatewayError, match="media_limit_exceeded"):
        await lease_records(
            twice, route_call(twice), _plan(_evidence(0, "ev_png"), _evidence(1, "ev_png")), "m"
        )


async def test_stage_inline_hands_over_only_inline_parts_and_keeps_the_rest() -> None:
    wav_url = "data:audio/wav;base64,UklGRg=="
    media = FakeMedia(staged={1: DATA_STAGED, 2: WAV})
    call = make_call(media=media)
    route_call(call).records[0] = PNG
    plan = _plan(_evidence(0, "ev_png"), _inline(1), _inline(2, wav_url, 4, "audio"))
    await stage_inline(call, routed_of(call), plan)
    assert media.events == [
        (
            "stage",
            [
                (1, "image/png", DATA_URL.partition(",")[2], "image"),
                (2, "audio/wav", "UklGRg==", "audio"),
            ],
        )
    ]
    assert routed_of(call).records == {0: PNG, 1: DATA_STAGED, 2: WAV}


async def test_stage_inline_passes_no_type_where_none_was_declared() -> None:
    media = FakeMedia(staged={0: DATA_STAGED})
    call = make_call(media=media)
    await stage_inline(call, route_call(call), _plan(_inline(0, "data:;base64,YWJj", 3)))
    # The evidence service decides the type from the bytes.
    assert media.events == [("stage", [(0, None, "YWJj", "image")])]
    assert routed_of(call).records == {0: DATA_STAGED}
