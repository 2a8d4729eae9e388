"""Images and speech through the pipeline's steps (spec §23): route kinds, n worker
calls each with its own permit and request count, one answer, one receipt."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest

from gateway.admission import AdmissionGroup
from gateway.apis.base import Api, PlanContext
from gateway.apis.chat.api import ChatApi
from gateway.apis.embeddings.api import EmbeddingsApi
from gateway.apis.images.api import ImagesApi
from gateway.apis.speech.api import SpeechApi
from gateway.config import GatewayConfig, ImagesConfig, LimitsConfig
from gateway.config.policy import Cost, PolicyLimits, Tenant, TenantPolicy, resolve_limits
from gateway.core.errors import GatewayError
from gateway.core.signed_urls import check
from gateway.pipeline import steps
from gateway.pipeline.call import Call
from gateway.pipeline.settle import settle
from gateway.ratelimit.memory import MemoryLimitsStore
from gateway.upstream.base import Accept, Rejection, WorkerStream
from gateway.upstream.table import RouteTable, Worker, capacities
from tests.pipeline.support import (
    LINK_KEY,
    NONCE,
    Caller,
    FakeFiles,
    FakeTransport,
    FakeUpstream,
    make_call,
    make_services,
    read_body,
)
from tests.support.media import image_answer, png, wav

CHAT, EMBED, IMAGE, SPEECH = "/m/chat", "/m/embed", "/m/image", "/m/speech"
MODELS = {"chat": CHAT, "embed": EMBED, "image": IMAGE, "speech": SPEECH}


class _Worker(FakeTransport):
    """Answers each call with the next queued answer; records what each call saw."""

    def __init__(self, worker: Worker, answers: list[FakeUpstream]) -> None:
        self.worker = worker
        self.answers = answers
        self.seen: list[dict[str, Any]] = []

    async def open_stream(
        self,
        path: str,
        body: bytes | AsyncIterator[bytes],
        request_id: str,
        *,
        size: int | None = None,
        accept: Accept = "sse",
        traceparent: bytes | None = None,
        rejection: Rejection = "classified",
    ) -> WorkerStream:
        self.seen.append(
            {
                "path": path,
                "body": orjson.loads(await read_body(body)),
                "accept": accept,
                "rejection": rejection,
                # What the admission pool held while this call ran.
                "in_use": self.worker.admission.in_use,
                "live": self.worker.live,
            }
        )
        return self.answers.pop(0)


def _tenant(**limits: Any) -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models=MODELS,
        endpoints=["chat.completions", "embeddings", "images", "speech"],
        limits=PolicyLimits(**limits),
        cost=Cost(image_generation=3, speech=2),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


def _config() -> GatewayConfig:
    routes = [
        CHAT,
        {"route": EMBED, "kind": "embeddings"},
        {"route": IMAGE, "kind": "image"},
        {"route": SPEECH, "kind": "speech"},
    ]
    return GatewayConfig.model_validate(
        {"upstreams": [{"name": "w", "base_url": "http://127.0.0.1:9", "routes": routes}]}
    )


class _Rig:
    def __init__(self, **limits: Any) -> None:
        config = _config()
        admissions = AdmissionGroup(capacities(config), 8)
        self.table = RouteTable.build(config, admissions)
        self.worker = self.table.workers["w"]
        self.services = make_services(table=self.table, config=config, limits=MemoryLimitsStore())
        self.tenant = _tenant(**limits)
        self.caller = Caller()

    def plan(self, api: Api, body: dict[str, Any], **images: Any) -> Call:
        call = make_call(self.services, tenant=self.tenant, send=self.caller.send)
        context = PlanContext(
            self.tenant, NONCE, images=ImagesConfig(**images), public_base_url="https://gw.test"
        )
        call.plan = api.plan(body, context)
        return call

    def answers(self, *answers: FakeUpstream) -> _Worker:
        fake = _Worker(self.worker, list(answers))
        self.worker.client = fake
        return fake

    async def run(self, call: Call, api: Api) -> None:
        assert call.plan is not None
        routed = steps.resolve(call, call.plan, api.endpoint)
        try:
            async with asyncio.timeout(5):
                await steps.run(call, routed, api, call.plan)
        except GatewayError as exc:
            call.fail(exc)  # as the edge does
            raise
        finally:
            settle(call, api)

    def reply(self) -> tuple[dict[bytes, bytes], bytes]:
        start = self.caller.starts[0]
        return dict(start["headers"]), self.caller.body


@pytest.fixture
def rig() -> Iterator[_Rig]:
    yield _Rig()


def _image(size: int = 64, **options: Any) -> FakeUpstream:
    return FakeUpstream(
        [image_answer(png(size, size), **options)], content_type=b"application/json"
    )


# -- route kinds ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "body", "alias"),
    [
        (ChatApi(), {"messages": [{"role": "user", "content": "hi"}]}, "image"),
        (ChatApi(), {"messages": [{"role": "user", "content": "hi"}]}, "embed"),
        (ChatApi(), {"messages": [{"role": "user", "content": "hi"}]}, "speech"),
        (EmbeddingsApi(), {"input": "x"}, "speech"),
        (ImagesApi(), {"prompt": "p", "size": "64x64"}, "chat"),
        (ImagesApi(), {"prompt": "p", "size": "64x64"}, "speech"),
        (SpeechApi(), {"input": "hi"}, "image"),
        (SpeechApi(), {"input": "hi"}, "chat"),
    ],
)
def test_an_endpoint_on_a_route_of_another_kind_is_model_not_capable(
    rig: _Rig, api: Api, body: dict[str, Any], alias: str
) -> None:
    call = rig.plan(api, {"model": alias, **body})
    assert call.plan is not None
    with pytest.raises(GatewayError) as caught:
        steps.resolve(call, call.plan, api.endpoint)
    error = caught.value
    assert (error.code, error.status, error.param) == ("model_not_capable", 400, "model")
    # The receipt says where it would have gone; the worker was never asked.
    assert call.receipt.route == MODELS[alias]


@pytest.mark.parametrize(
    ("api", "body", "alias"),
    [
        (ChatApi(), {"messages": [{"role": "user", "content": "hi"}]}, "chat"),
        (EmbeddingsApi(), {"input": "x"}, "embed"),
        (EmbeddingsApi(), {"input": "x"}, "chat"),  # every config before kinds did
        (ImagesApi(), {"prompt": "p", "size": "64x64"}, "image"),
        (SpeechApi(), {"input": "hi"}, "speech"),
    ],
)
def test_an_endpoint_on_its_own_kind_resolves(
    rig: _Rig, api: Api, body: dict[str, Any], alias: str
) -> None:
    call = rig.plan(api, {"model": alias, **body})
    assert call.plan is not None
    assert steps.resolve(call, call.plan, api.endpoint).resolved.route == MODELS[alias]


def test_kinds_are_checked_before_readiness(rig: _Rig) -> None:
    class NotReady:
        def ready(self, route: str) -> bool:
            return False

    rig.services.readiness = NotReady()
    call = rig.plan(SpeechApi(), {"model": "image", "input": "hi"})
    assert call.plan is not None
    with pytest.raises(GatewayError, match="model_not_capable"):
        steps.resolve(call, call.plan, SpeechApi.endpoint)


# -- images: n calls ---------------------------------------------------------------


async def test_n_images_are_n_worker_calls_each_with_its_own_permit(rig: _Rig) -> None:
    api = ImagesApi()
    fake = rig.answers(*(_image(64, created=10 + i) for i in range(3)))
    call = rig.plan(api, {"model": "image", "prompt": "a fox", "n": 3, "size": "64x64"})
    await rig.run(call, api)
    # One permit of cost.image_generation (3) per call, given back before the next.
    assert [s["in_use"] for s in fake.seen] == [3, 3, 3]
    assert [s["live"] for s in fake.seen] == [1, 1, 1]
    assert rig.worker.admission.in_use == 0 and rig.worker.live == 0
    for seen in fake.seen:
        assert seen["body"] == {
            "model": IMAGE,
            "prompt": "a fox",
            "response_format": "B64Json",
            "width": 64,
            "height": 64,
        }
        assert (seen["path"], seen["accept"], seen["rejection"]) == (
            "/v1/images/generations",
            "json",
            "relayed",
        )
    headers, body = rig.reply()
    assert headers[b"content-type"] == b"application/json"
    answer = orjson.loads(body)
    assert answer["created"] == 10 and answer["usage"] == {"images": 3}
    assert [base64.b64decode(d["b64_json"]) for d in answer["data"]] == [png(64, 64)] * 3
    receipt = call.receipt
    assert (receipt.outcome, receipt.usage, receipt.endpoint) == (
        "complete",
        {"images": 3},
        "chat.completions",  # make_call's; the edge names the endpoint
    )
    assert receipt.outputs is not None and len(receipt.outputs) == 3
    assert receipt.ttft_ms is None  # images have no first token


async def test_each_image_counts_as_a_request_and_n_past_the_rate_is_refused_whole() -> None:
    rig = _Rig(requests_per_minute=4)
    api = ImagesApi()
    fake = rig.answers(*(_image() for _ in range(3)))
    await rig.run(rig.plan(api, {"model": "image", "prompt": "p", "n": 3, "size": "64x64"}), api)
    assert len(fake.seen) == 3
    assert rig.reply()[0][b"x-ratelimit-remaining-requests"] == b"1"
    call = rig.plan(api, {"model": "image", "prompt": "p", "n": 2, "size": "64x64"})
    with pytest.raises(GatewayError) as caught:
        await rig.run(call, api)
    assert caught.value.code == "rate_limited"
    assert len(fake.seen) == 3  # refused before any worker call


async def test_a_broken_image_fails_the_request_after_the_good_ones(rig: _Rig) -> None:
    api = ImagesApi()
    wrong = FakeUpstream([image_answer(png(80, 64))], content_type=b"application/json")
    fake = rig.answers(_image(), wrong, _image())
    call = rig.plan(api, {"model": "image", "prompt": "p", "n": 3, "size": "64x64"})
    with pytest.raises(GatewayError) as caught:
        await rig.run(call, api)
    assert caught.value.code == "upstream_protocol_error"
    assert len(fake.seen) == 2 and rig.caller.messages == []
    assert rig.worker.admission.in_use == 0 and rig.worker.live == 0
    receipt = call.receipt
    assert receipt.outcome == "protocol_error" and receipt.usage == {"images": 1}


async def test_url_images_are_stored_as_tenant_files_and_linked(rig: _Rig) -> None:
    api = ImagesApi()
    rig.answers(_image(), _image())
    body = {"model": "image", "prompt": "p", "n": 2, "size": "64x64", "response_format": "url"}
    call = rig.plan(api, body)
    await rig.run(call, api)
    files = rig.services.image_files
    assert isinstance(files, FakeFiles)
    assert [(f.tenant, f.data, f.name) for f in files.stored] == [
        ("acme", png(64, 64), "image-1.png"),
        ("acme", png(64, 64), "image-2.png"),
    ]
    assert rig.services.files is None  # the agents' store is not the images' (yet)
    links = [d["url"] for d in orjson.loads(rig.reply()[1])["data"]]
    for link, stored in zip(links, files.stored, strict=True):
        prefix = f"https://gw.test/v1/files/{stored.id}/content?sig="
        assert link.startswith(prefix)
        sig, exp = link[len(prefix) :].split("&exp=")
        assert check(LINK_KEY, stored.id, sig, exp, now=0)


# -- speech -------------------------------------------------------------------------


async def test_speech_is_one_call_of_its_own_cost_relayed_as_audio_wav(rig: _Rig) -> None:
    api = SpeechApi()
    body = wav(2400)
    fake = rig.answers(
        FakeUpstream([body[:100], body[100:]], content_type=b"audio/wav; rate=24000; channels=1")
    )
    call = rig.plan(api, {"model": "speech", "input": "Hello.", "voice": "alloy"})
    await rig.run(call, api)
    assert [s["in_use"] for s in fake.seen] == [2]
    assert fake.seen[0]["body"] == {"model": SPEECH, "input": "Hello.", "response_format": "wav"}
    assert (fake.seen[0]["path"], fake.seen[0]["accept"]) == ("/v1/audio/speech", "audio")
    headers, sent = rig.reply()
    assert headers[b"content-type"] == b"audio/wav" and sent == body
    assert headers[b"content-length"] == str(len(body)).encode()
    assert call.receipt.usage == {"audio_ms": 100}
    assert call.receipt.outputs is not None and call.receipt.outputs[0]["bytes"] == len(body)


async def test_a_broken_wav_reaches_the_caller_as_nothing(rig: _Rig) -> None:
    api = SpeechApi()
    broken = wav(2400)[:-2]  # the data chunk says 2 bytes more than it has
    rig.answers(FakeUpstream([broken], content_type=b"audio/wav"))
    call = rig.plan(api, {"model": "speech", "input": "Hello."})
    with pytest.raises(GatewayError) as caught:
        await rig.run(call, api)
    assert caught.value.code == "upstream_protocol_error"
    assert rig.caller.messages == []
