"""Images and speech through the real gateway (spec §23, §24), with the official
``openai`` SDK's ``images.generate`` and ``audio.speech.create`` as the callers and
the protocol simulator as a diffusion and a speech worker."""

from __future__ import annotations

import base64
import io
import struct
import time
import wave
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack, worker_posts

IMAGE_ROUTE, SPEECH_ROUTE = "/srv/models/flux-sim", "/srv/models/dia-sim"
ENDPOINTS = ["chat.completions", "embeddings", "images", "speech", "models"]
FAST = {"first_event_timeout_s": 1, "idle_timeout_s": 1, "total_timeout_s": 10}
PUBLIC = "https://images.example.test"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    mp.setenv("GATEWAY_TEST_LINK_KEY", "k" * 40)
    from gateway.testing.harness import SIM_ROUTE

    models = {"gemma-4-mm": SIM_ROUTE, "flux": IMAGE_ROUTE, "dia": SPEECH_ROUTE}
    acme = {"endpoints": ENDPOINTS, "models": models}
    # globex: three requests a minute, and no speech.
    globex = {
        "endpoints": ["chat.completions", "images"],
        "models": models,
        "limits": {"max_output_tokens": 512, "requests_per_minute": 3},
    }
    try:
        with running_stack(
            tmp_path_factory.mktemp("media"),
            acme=acme,
            globex=globex,
            kinds={IMAGE_ROUTE: "image", SPEECH_ROUTE: "speech"},
            upstream=FAST,
            server={"public_base_url": PUBLIC},
            images={"url_key_env": "GATEWAY_TEST_LINK_KEY", "url_ttl_s": 60},
        ) as running:
            yield running
    finally:
        mp.undo()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _last_post(stack: Stack) -> dict[str, Any]:
    body = worker_posts(stack.sim)[-1].json
    assert isinstance(body, dict)
    return body


# -- images ------------------------------------------------------------------------


def test_images_generate_answers_openais_shape(stack: Stack) -> None:
    client = stack.sdk()
    before = len(worker_posts(stack.sim))
    raw = client.images.with_raw_response.generate(
        model="flux", prompt="a red fox", n=2, size="256x128", quality="hd", user="u1"
    )
    response = raw.parse()
    assert len(worker_posts(stack.sim)) - before == 2  # one worker call per image
    assert _last_post(stack) == {
        "model": IMAGE_ROUTE,
        "prompt": "a red fox",
        "response_format": "B64Json",
        "width": 256,
        "height": 128,
    }
    assert response.data is not None and len(response.data) == 2
    for image in response.data:
        assert image.b64_json is not None and not image.b64_json.startswith("data:")
        assert _png_size(base64.b64decode(image.b64_json)) == (256, 128)
    assert response.to_dict()["usage"] == {"images": 2}
    receipt = stack.receipt(raw.headers["x-request-id"])
    assert (receipt["endpoint"], receipt["outcome"], receipt["usage"]) == (
        "images",
        "complete",
        {"images": 2},
    )
    assert [(o["width"], o["height"]) for o in receipt["outputs"]] == [(256, 128)] * 2
    assert receipt["route"] == IMAGE_ROUTE and receipt["ttft_ms"] is None


def test_url_images_are_signed_links_that_work_without_credentials(stack: Stack) -> None:
    response = stack.sdk().images.generate(
        model="flux", prompt="a blue fox", size="64x64", response_format="url"
    )
    assert response.data is not None
    link = response.data[0].url
    assert link is not None and link.startswith(PUBLIC + "/v1/files/file_")
    parts = urlsplit(link)
    exp = int(dict(p.split("=") for p in parts.query.split("&"))["exp"])
    assert time.time() < exp <= time.time() + 61
    local = f"{stack.url}{parts.path}?{parts.query}"  # the public origin is this gateway
    with httpx.Client() as plain:  # no credentials at all
        got = plain.get(local)
        assert got.status_code == 200 and got.headers["content-type"] == "image/png"
        assert got.headers["cache-control"] == "private, no-store"
        assert _png_size(got.content) == (64, 64)
        tampered = plain.get(local.replace("exp=", "exp=1"))
        forged = plain.get(f"{stack.url}{parts.path}?sig={'0' * 64}&exp={exp}")
        bare = plain.get(f"{stack.url}{parts.path}")
    for refused in (tampered, forged):
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_token"
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "missing_credentials"


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"n": 5}, "invalid_request", "n"),
        ({"size": "big"}, "invalid_request", "size"),
        ({"size": "1000x1000"}, "media_limit_exceeded", "size"),
        ({"size": "2048x2048"}, "media_limit_exceeded", "size"),
        ({"response_format": "b64"}, "invalid_request", "response_format"),
        ({"background": "transparent"}, "unsupported_field", "background"),
    ],
)
def test_image_requests_off_the_contract_are_refused_before_the_worker(
    stack: Stack, body: dict[str, Any], code: str, param: str
) -> None:
    before = len(worker_posts(stack.sim))
    with stack.client() as client:
        answer = client.post(
            "/v1/images/generations", json={"model": "flux", "prompt": "p", **body}
        )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert len(worker_posts(stack.sim)) == before


_IMAGE_FAULTS = {
    "bad_signature": "upstream_protocol_error",
    "bad_crc": "upstream_protocol_error",
    "wrong_size": "upstream_protocol_error",
    "not_data_url": "upstream_protocol_error",
    "bad_base64": "upstream_protocol_error",
    "two_images": "upstream_protocol_error",
    "no_image": "upstream_protocol_error",
    "oversize": "upstream_protocol_error",
    "redirect": "upstream_protocol_error",
    "huge_headers": "upstream_protocol_error",
    "wrong_request_id": "upstream_protocol_error",
    "wrong_content_type": "upstream_protocol_error",
    "gzip": "upstream_protocol_error",
    "close_mid": "upstream_unavailable",
    "hang": "upstream_timeout",
    "hang_headers": "upstream_timeout",
}


@pytest.mark.parametrize("fault", sorted(_IMAGE_FAULTS))
def test_every_image_fault_is_refused_before_a_byte(stack: Stack, fault: str) -> None:
    client = stack.sdk()
    with pytest.raises(openai.APIStatusError) as caught:
        client.images.generate(model="flux", prompt=f"x [[sim fault={fault}]]", size="64x64")
    error = caught.value
    assert error.status_code in (502, 504)
    assert isinstance(error.body, dict) and error.body["code"] == _IMAGE_FAULTS[fault]
    receipt = stack.receipt(error.response.headers["x-request-id"])
    assert receipt["outcome"] != "complete" and receipt["endpoint"] == "images"


def test_an_image_worker_without_a_request_id_echo_is_served(stack: Stack) -> None:
    response = stack.sdk().images.generate(
        model="flux", prompt="x [[sim fault=no_request_id]]", size="64x64"
    )
    assert response.data is not None and len(response.data) == 1


@pytest.mark.parametrize("endpoint", ["images", "speech"])
@pytest.mark.parametrize(
    ("status", "code", "http"), [(422, "invalid_request", 400), (500, "upstream_error", 502)]
)
def test_worker_errors_map_as_settled(
    stack: Stack, endpoint: str, status: int, code: str, http: int
) -> None:
    client = stack.sdk()
    directive = f"x [[sim status={status}]]"
    with pytest.raises(openai.APIStatusError) as caught:
        if endpoint == "images":
            client.images.generate(model="flux", prompt=directive, size="64x64")
        else:
            client.audio.speech.create(model="dia", voice="alloy", input=directive)
    assert caught.value.status_code == http
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == code
    if status == 422:
        assert caught.value.body["message"] == "simulated failure"
    receipt = stack.receipt(caught.value.response.headers["x-request-id"])
    assert receipt["outcome"] == "upstream_error"


def test_each_image_counts_against_requests_per_minute(stack: Stack) -> None:
    client = stack.sdk(stack.rs256(tenant="globex"))
    response = client.images.with_raw_response.generate(model="flux", prompt="p", n=3, size="64x64")
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    before = len(worker_posts(stack.sim))
    with pytest.raises(openai.RateLimitError):
        client.images.generate(model="flux", prompt="p", size="64x64")
    assert len(worker_posts(stack.sim)) == before


# -- route kinds -----------------------------------------------------------------------


def test_an_endpoint_on_a_route_of_another_kind_is_model_not_capable(stack: Stack) -> None:
    client = stack.sdk()
    before = len(worker_posts(stack.sim))
    calls: list[Callable[[], object]] = [
        lambda: client.images.generate(model="gemma-4-mm", prompt="p", size="64x64"),
        lambda: client.chat.completions.create(
            model="flux", messages=[{"role": "user", "content": "hi"}]
        ),
        lambda: client.embeddings.create(model="dia", input="x"),
        lambda: client.audio.speech.create(model="flux", voice="alloy", input="hi"),
    ]
    for call in calls:
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert isinstance(caught.value.body, dict)
        assert (caught.value.body["code"], caught.value.body["param"]) == (
            "model_not_capable",
            "model",
        )
    assert len(worker_posts(stack.sim)) == before


def test_media_routes_are_ready_without_a_probe(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url) as client:
        routes = client.get("/readyz").json()["routes"]
    assert routes[IMAGE_ROUTE]["ready"] and routes[SPEECH_ROUTE]["ready"]


# -- speech -------------------------------------------------------------------------------


def test_speech_create_answers_a_wav_as_exactly_audio_wav(stack: Stack) -> None:
    raw = stack.sdk().audio.speech.with_raw_response.create(
        model="dia", voice="alloy", input="Hello there.", speed=1.5, instructions="calm"
    )
    assert raw.headers["content-type"] == "audio/wav"
    assert _last_post(stack) == {
        "model": SPEECH_ROUTE,
        "input": "Hello there.",
        "response_format": "wav",
    }
    audio = raw.parse().content
    with wave.open(io.BytesIO(audio)) as parsed:
        assert (parsed.getsampwidth(), parsed.getnchannels()) == (2, 1)
        frames, rate = parsed.getnframes(), parsed.getframerate()
    receipt = stack.receipt(raw.headers["x-request-id"])
    assert receipt["endpoint"] == "speech" and receipt["outcome"] == "complete"
    assert receipt["usage"] == {"audio_ms": frames * 1000 // rate}
    assert receipt["outputs"][0]["bytes"] == len(audio)


def test_speech_pcm_names_its_rate_and_channels(stack: Stack) -> None:
    raw = stack.sdk().audio.speech.with_raw_response.create(
        model="dia", voice="alloy", input="Hi.", response_format="pcm"
    )
    assert raw.headers["content-type"] == "audio/pcm;rate=44100;channels=1"
    assert len(raw.parse().content) % 2 == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "mp3"}, "response_format"),
        ({"response_format": "opus"}, "response_format"),
        ({"stream_format": "sse"}, "stream_format"),
    ],
)
def test_formats_the_worker_cannot_make_are_unsupported(
    stack: Stack, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        stack.sdk().audio.speech.create(model="dia", voice="alloy", input="Hi.", **fields)
    body = caught.value.body
    assert isinstance(body, dict) and (body["code"], body["param"]) == ("unsupported_field", param)


def test_input_past_its_bound_is_prompt_too_large(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        stack.sdk().audio.speech.create(model="dia", voice="alloy", input="x" * 4097)
    body = caught.value.body
    assert isinstance(body, dict) and (body["code"], body["param"]) == ("prompt_too_large", "input")


_SPEECH_FAULTS = {
    "bad_riff": "upstream_protocol_error",
    "size_mismatch": "upstream_protocol_error",
    "not_pcm": "upstream_protocol_error",
    "oversize": "upstream_protocol_error",
    "redirect": "upstream_protocol_error",
    "huge_headers": "upstream_protocol_error",
    "wrong_request_id": "upstream_protocol_error",
    "wrong_content_type": "upstream_protocol_error",
    "close_mid": "upstream_unavailable",
    "hang": "upstream_timeout",
    "hang_headers": "upstream_timeout",
}


@pytest.mark.parametrize("fault", sorted(_SPEECH_FAULTS))
def test_every_speech_fault_is_refused_before_a_byte(stack: Stack, fault: str) -> None:
    with stack.client() as client:
        answer = client.post(
            "/v1/audio/speech", json={"model": "dia", "input": f"x [[sim fault={fault}]]"}
        )
    assert answer.status_code in (502, 504)
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["code"] == _SPEECH_FAULTS[fault]


def test_an_odd_pcm_body_is_refused(stack: Stack) -> None:
    with stack.client() as client:
        answer = client.post(
            "/v1/audio/speech",
            json={"model": "dia", "input": "x [[sim fault=odd_pcm]]", "response_format": "pcm"},
        )
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "upstream_protocol_error"


def test_speech_is_an_endpoint_the_policy_must_allow(stack: Stack) -> None:
    with pytest.raises(openai.PermissionDeniedError) as caught:
        stack.sdk(stack.rs256(tenant="globex")).audio.speech.create(
            model="dia", voice="alloy", input="Hi."
        )
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "endpoint_not_allowed"


def test_metrics_count_each_endpoint(stack: Stack) -> None:
    before = stack.metric("gateway_requests_total", endpoint="speech", status="200")
    stack.sdk().audio.speech.create(model="dia", voice="alloy", input="Hi.")
    after = stack.metric("gateway_requests_total", endpoint="speech", status="200")
    assert after == before + 1
    assert stack.metric("gateway_request_duration_seconds_count", endpoint="images") > 0
