"""Responses ``include`` (spec §14): the values the worker parses and acts on not at
all, and that name no built-in tool's output, are forwarded as sent; every other
entry is refused naming ``include[i]``. No sockets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.apis.base import PlanContext
from gateway.apis.responses.api import INCLUDE_FORWARDED, ResponsesApi
from gateway.config import LimitsConfig
from gateway.config.policy import PolicyLimits, Tenant, TenantPolicy, resolve_limits
from gateway.core.errors import GatewayError
from gateway.testing.simulator.handlers import Job, route
from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.state import State

ROUTE = "/srv/mosaic-models/" + "ef" * 32
ALIAS = "gemma-4-mm"
API = ResponsesApi()
#: every value of OpenAI's ``ResponseIncludable`` that the gateway refuses
REFUSED = [
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.output_text.logprobs",
]


def _tenant() -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models={ALIAS: ROUTE},
        modalities=["text", "image"],
        limits=PolicyLimits(max_output_tokens=512),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


TENANT = _tenant()


def forwarded(include: Any) -> dict[str, Any]:
    body = {"model": ALIAS, "input": "hi", "include": include}
    return API.forward(API.plan(body, PlanContext(TENANT, "0123456789abcdef")), ROUTE)


def refusal(include: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        forwarded(include)
    return info.value


def test_the_forwarded_values_are_exactly_two() -> None:
    assert {"reasoning.encrypted_content", "message.input_image.image_url"} == INCLUDE_FORWARDED


@pytest.mark.parametrize(
    "include",
    [
        [],
        ["reasoning.encrypted_content"],
        ["message.input_image.image_url"],
        ["message.input_image.image_url", "reasoning.encrypted_content"],
        ["reasoning.encrypted_content", "reasoning.encrypted_content"],
    ],
)
def test_forwarded_as_sent_and_the_worker_parses_them(include: list[str]) -> None:
    body = forwarded(include)
    assert body["include"] == include
    # The worker's serde enum takes them (an unknown value would be its 422).
    state = State([ROUTE], SimKnobs(), True, 1)
    reply = route(
        state,
        "POST",
        "/v1/responses",
        orjson.dumps(body),
        {"content-type": "application/json"},
        "req_include",
    )
    assert isinstance(reply, Job)


@pytest.mark.parametrize("value", REFUSED)
def test_refused_values_name_their_index(value: str) -> None:
    error = refusal(["reasoning.encrypted_content", value])
    assert (error.code, error.status, error.param) == ("unsupported_field", 400, "include[1]")
    assert value not in error.message, "messages never echo caller data"
    assert "include[1]" in error.message


@pytest.mark.parametrize(
    "value", ["", "message.output_text", "REASONING.ENCRYPTED_CONTENT", "x" * 300]
)
def test_unknown_values_are_refused(value: str) -> None:
    error = refusal([value])
    assert (error.code, error.param) == ("unsupported_field", "include[0]")


def test_the_first_refused_entry_is_named() -> None:
    error = refusal(["message.output_text.logprobs", "file_search_call.results"])
    assert error.param == "include[0]"
    assert "logprobs" in error.message
    assert "built-in tools" in refusal(["file_search_call.results"]).message


@pytest.mark.parametrize(
    ("include", "param"),
    [("reasoning.encrypted_content", "include"), ({"a": 1}, "include"), ([1], "include[0]")],
)
def test_wrong_shapes(include: Any, param: str) -> None:
    error = refusal(include)
    assert (error.code, error.param) == ("invalid_request", param)
