"""Planning ``POST /v1/images/generations`` (spec §23, §24): fields, n, size, format."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apis.base import PlanContext
from gateway.apis.images.answer import ImageRequest
from gateway.apis.images.api import ImagesApi
from gateway.config import ImagesConfig
from gateway.core.errors import GatewayError
from tests.pipeline.support import ALIAS, NONCE, ROUTE, make_tenant

API = ImagesApi()
PUBLIC = "https://gw.example.com"


def ctx(*, public: str | None = PUBLIC, **images: Any) -> PlanContext:
    return PlanContext(make_tenant(), NONCE, images=ImagesConfig(**images), public_base_url=public)


def refusal(body: dict[str, Any], context: PlanContext | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        API.plan({"model": ALIAS, "prompt": "a red fox", **body}, context or ctx())
    return caught.value


def test_the_worker_always_gets_b64json_and_an_explicit_size() -> None:
    plan = API.plan({"model": ALIAS, "prompt": "a red fox", "response_format": "url"}, ctx())
    assert API.forward(plan, ROUTE) == {
        "model": ROUTE,
        "prompt": "a red fox",
        "response_format": "B64Json",
        "width": 1024,
        "height": 1024,
    }
    assert (plan.calls, plan.stream, plan.max_tokens, plan.bills_tokens) == (1, False, None, False)
    assert plan.detail == ImageRequest(1024, 1024, True, 16_777_216)
    assert plan.prompt_bytes == len("a red fox")


def test_n_is_the_number_of_worker_calls_and_dropped_fields_are_dropped() -> None:
    body = {
        "model": ALIAS,
        "prompt": "p",
        "n": 3,
        "size": "512x768",
        "quality": "hd",
        "style": "vivid",
        "user": "u-1",
    }
    plan = API.plan(body, ctx())
    assert plan.calls == 3
    forwarded = API.forward(plan, ROUTE)
    assert (forwarded["width"], forwarded["height"]) == (512, 768)
    assert not {"quality", "style", "user", "n", "size"} & set(forwarded)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 5}, "n"),
        ({"n": "2"}, "n"),
        ({"n": 1.0}, "n"),
        ({"size": "1024"}, "size"),
        ({"size": "1024x"}, "size"),
        ({"size": "0x64"}, "size"),
        ({"size": " 64x64"}, "size"),
        ({"size": 64}, "size"),
        ({"size": "auto"}, "size"),
        ({"response_format": "B64Json"}, "response_format"),
        ({"response_format": "png"}, "response_format"),
        ({"prompt": 7}, "prompt"),
    ],
)
def test_malformed_fields_are_invalid_request_naming_them(body: dict[str, Any], param: str) -> None:
    error = refusal(body)
    assert (error.code, error.status, error.param) == ("invalid_request", 400, param)


@pytest.mark.parametrize(
    "size", ["1000x1024", "1024x1000", "48x64", "64x48", "1552x64", "1536x1024", "1040x1024"]
)
def test_sizes_off_the_bounds_are_media_limit_exceeded(size: str) -> None:
    error = refusal({"size": size})
    assert (error.code, error.status, error.param) == ("media_limit_exceeded", 400, "size")


@pytest.mark.parametrize("size", ["64x64", "1536x512", "1024x1024", "512x1536"])
def test_sizes_within_the_bounds_are_planned(size: str) -> None:
    width, height = (int(side) for side in size.split("x"))
    plan = API.plan({"model": ALIAS, "prompt": "p", "size": size}, ctx())
    assert (plan.body["width"], plan.body["height"]) == (width, height)


def test_the_bounds_follow_the_config() -> None:
    small = ctx(max_n=2, max_side=256, max_pixels=256 * 128)
    assert refusal({"n": 3}, small).param == "n"
    assert refusal({"size": "256x256"}, small).code == "media_limit_exceeded"
    assert API.plan({"model": ALIAS, "prompt": "p", "size": "256x128"}, small).calls == 1


def test_url_needs_a_public_base_url() -> None:
    error = refusal({"response_format": "url"}, ctx(public=None))
    assert (error.code, error.param) == ("unsupported_field", "response_format")
    plan = API.plan({"model": ALIAS, "prompt": "p"}, ctx(public=None))
    assert plan.detail.url is False


@pytest.mark.parametrize("field", ["background", "output_format", "moderation", "stream", "size2"])
def test_other_fields_are_unsupported(field: str) -> None:
    error = refusal({field: "x"})
    assert (error.code, error.param) == ("unsupported_field", field)


def test_the_prompt_is_bounded_and_needs_the_text_modality() -> None:
    tenant = make_tenant(modalities=["image"])
    with pytest.raises(GatewayError) as caught:
        API.plan({"model": ALIAS, "prompt": "p"}, PlanContext(tenant, NONCE))
    assert (caught.value.code, caught.value.param) == ("modality_not_allowed", "prompt")
    huge = "x" * (make_tenant().limits.max_prompt_bytes + 1)
    error = refusal({"prompt": huge})
    assert (error.code, error.param) == ("prompt_too_large", "prompt")


def test_unknown_alias_and_missing_prompt() -> None:
    with pytest.raises(GatewayError) as caught:
        API.plan({"model": "nope", "prompt": "p"}, ctx())
    assert caught.value.code == "model_not_found"
    with pytest.raises(GatewayError) as caught:
        API.plan({"model": ALIAS}, ctx())
    assert (caught.value.code, caught.value.param) == ("invalid_request", "prompt")


def test_the_endpoint_runs_on_image_routes_with_its_own_cost() -> None:
    endpoint = API.endpoint
    assert endpoint.route_kinds == frozenset({"image"})
    assert (endpoint.cost, endpoint.exchange, endpoint.worker_rejection) == (
        "image_generation",
        "json",
        "relayed",
    )
    assert (endpoint.name, endpoint.policy_endpoint, endpoint.scope) == (
        "images",
        "images",
        "inference",
    )
