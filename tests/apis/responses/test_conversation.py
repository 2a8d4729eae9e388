"""Conversations are the gateway's (spec §17): what a Responses request keeps of
its own input, how a kept chain is forwarded as explicit items, and the
``input_items`` listing. Pure; every kept item validates as the OpenAI SDK's
``ResponseItem``, strictly."""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
import pytest
from openai.types.responses import ResponseItem

from gateway.apis.base import Plan, PlanContext
from gateway.apis.responses.api import ResponsesApi
from gateway.apis.responses.conversation import expand, history, input_items_page, kept_input
from gateway.config import LimitsConfig
from gateway.config.policy import PolicyLimits, Tenant, TenantPolicy, resolve_limits
from gateway.core.body import placeholder
from gateway.core.errors import GatewayError

ALIAS = "gemma-4-mm"
ROUTE = "/srv/models/chat"
NONCE = "0123456789abcdef"
API = ResponsesApi()
ITEM = pydantic.TypeAdapter(ResponseItem)


def tenant(**limits: Any) -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models={ALIAS: ROUTE},
        endpoints=["responses"],
        modalities=["text", "image"],
        media={"inline_data": "stage"},
        limits=PolicyLimits(**limits),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


def plan(body_input: Any, who: Tenant | None = None, **body: Any) -> Plan:
    request = {"model": ALIAS, "input": body_input, **body}
    return API.plan(request, PlanContext(who or tenant(), NONCE))


def strict(item: dict[str, Any]) -> None:
    ITEM.validate_python(item, strict=True)


FOLLOW_UP_INPUT: list[dict[str, Any]] = [
    {"role": "user", "content": "weather?"},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "calling", "annotations": []}],
        "id": "msg_given",
        "status": "completed",
    },
    {"type": "function_call", "call_id": "call-1", "name": "get_weather", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call-1", "output": "sunny"},
    {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
]


# -- kept_input ------------------------------------------------------------------


def test_a_string_input_is_kept_as_one_user_message() -> None:
    (item,) = kept_input(plan("hello"))
    assert item["type"] == "message" and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "hello"}]
    assert item["id"].startswith("msg_") and len(item["id"]) == 4 + 24
    assert item["status"] == "completed"
    strict(item)


def test_every_kept_item_has_an_id_and_validates_as_the_sdks() -> None:
    kept = kept_input(plan(FOLLOW_UP_INPUT))
    assert [i["type"] for i in kept] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert kept[1]["id"] == "msg_given", "a given id is kept"
    assert kept[2]["id"].startswith("fc_") and kept[3]["id"].startswith("fco_")
    assert kept[2]["arguments"] == "{}" and kept[3]["output"] == "sunny"
    for item in kept:
        strict(item)
    assert len({i["id"] for i in kept}) == len(kept)


def test_media_are_kept_as_the_caller_wrote_them() -> None:
    data_url = "data:image/png;base64,iVBORw0KGgo="
    content = [
        {"type": "input_image", "image_url": "evidence:ev_abc"},
        {"type": "image_url", "image_url": {"url": data_url}},
        {"type": "input_text", "text": "what?"},
    ]
    planned = plan([{"role": "user", "content": content}])
    forwarded = planned.body["input"][0]["content"]
    assert forwarded[0]["image_url"] == placeholder(NONCE, 0), "the worker's body is planned"
    (item,) = kept_input(planned)
    assert item["content"] == [
        {"type": "input_image", "image_url": "evidence:ev_abc", "detail": "auto"},
        {"type": "input_image", "image_url": data_url, "detail": "auto"},
        {"type": "input_text", "text": "what?"},
    ]
    strict(item)


# -- history and expand -----------------------------------------------------------


def _link(own: Plan, output: list[dict[str, Any]]) -> tuple[bytes, bytes]:
    return orjson.dumps(kept_input(own)), orjson.dumps(output)


ANSWER: list[dict[str, Any]] = [
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call-9",
        "name": "lookup",
        "arguments": '{"q":1}',
        "status": "completed",
    },
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hi there", "annotations": [], "logprobs": []}],
    },
]


def test_history_is_inputs_then_outputs_oldest_first_in_the_workers_forms() -> None:
    first = _link(plan("one", instructions="be terse"), ANSWER)
    second = _link(plan("two"), [ANSWER[2]])
    assert history([first, second]) == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"type": "function_call", "call_id": "call-9", "name": "lookup", "arguments": '{"q":1}'},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi there"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi there"}],
        },
    ]


def test_expand_puts_the_conversation_before_the_new_input() -> None:
    link = _link(plan("one"), [ANSWER[2]])
    follow = plan("again", previous_response_id="resp_prev", instructions="only mine")
    before = (follow.prompt_bytes, follow.turns)
    forward = API.forward(follow, ROUTE)
    assert "previous_response_id" not in forward and forward["store"] is False
    expand(forward, follow, [link], tenant())
    assert forward["input"][-1] == {"type": "message", "role": "user", "content": "again"}
    assert [i["role"] for i in forward["input"]] == ["user", "assistant", "user"]
    assert forward["instructions"] == "only mine", "the chain's instructions are not carried"
    assert follow.turns == before[1] + 2
    assert follow.prompt_bytes == before[0] + len("one") + len("hi there")


def test_a_list_input_keeps_its_items_after_the_history() -> None:
    link = _link(plan("one"), [ANSWER[2]])
    follow = plan([{"role": "user", "content": "next"}], previous_response_id="resp_prev")
    forward = API.forward(follow, ROUTE)
    expand(forward, follow, [link], tenant())
    assert forward["input"][-1] == {"role": "user", "content": "next"}
    assert len(forward["input"]) == 3


def test_history_media_are_planned_again() -> None:
    content = [{"type": "input_image", "image_url": "evidence:ev_old"}]
    link = _link(plan([{"role": "user", "content": content}]), [ANSWER[2]])
    follow = plan(
        [{"role": "user", "content": [{"type": "input_image", "image_url": "evidence:ev_new"}]}],
        previous_response_id="resp_prev",
    )
    forward = API.forward(follow, ROUTE)
    expand(forward, follow, [link], tenant())
    assert [ref.evidence_id for ref in follow.media] == ["ev_new", "ev_old"]
    assert forward["input"][0]["content"] == [
        {"type": "input_image", "image_url": placeholder(NONCE, 1)}
    ]


def test_a_conversation_past_max_prompt_bytes_names_previous_response_id() -> None:
    small = tenant(max_prompt_bytes=100)
    links = [_link(plan("x" * 40, small), [ANSWER[2]]) for _ in range(3)]
    follow = plan("y", small, previous_response_id="resp_prev")
    with pytest.raises(GatewayError) as caught:
        expand(API.forward(follow, ROUTE), follow, links, small)
    assert (caught.value.code, caught.value.param) == ("prompt_too_large", "previous_response_id")


def test_history_media_count_against_max_media_parts() -> None:
    one = tenant(max_media_parts=1)
    content = [{"type": "input_image", "image_url": "evidence:ev_old"}]
    link = _link(plan([{"role": "user", "content": content}], one), [])
    follow = plan(
        [{"role": "user", "content": [{"type": "input_image", "image_url": "evidence:ev_new"}]}],
        one,
        previous_response_id="resp_prev",
    )
    with pytest.raises(GatewayError) as caught:
        expand(API.forward(follow, ROUTE), follow, [link], one)
    assert (caught.value.code, caught.value.param) == (
        "media_limit_exceeded",
        "previous_response_id",
    )


# -- input_items_page ------------------------------------------------------------

ITEMS = [{"id": f"msg_{i}", "type": "message"} for i in range(5)]


def test_input_items_default_to_newest_first_twenty() -> None:
    page = input_items_page(ITEMS, {})
    assert [i["id"] for i in page["data"]] == ["msg_4", "msg_3", "msg_2", "msg_1", "msg_0"]
    assert (page["object"], page["first_id"], page["last_id"], page["has_more"]) == (
        "list",
        "msg_4",
        "msg_0",
        False,
    )


def test_input_items_page_after_an_id() -> None:
    first = input_items_page(ITEMS, {"order": "asc", "limit": "2"})
    assert [i["id"] for i in first["data"]] == ["msg_0", "msg_1"] and first["has_more"]
    second = input_items_page(ITEMS, {"order": "asc", "limit": "2", "after": first["last_id"]})
    assert [i["id"] for i in second["data"]] == ["msg_2", "msg_3"] and second["has_more"]
    last = input_items_page(ITEMS, {"order": "asc", "limit": "2", "after": "msg_3"})
    assert [i["id"] for i in last["data"]] == ["msg_4"] and not last["has_more"]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"order": "newest"}, "order"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"after": "msg_unknown"}, "after"),
    ],
)
def test_bad_query_values_name_their_param(query: dict[str, str], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        input_items_page(ITEMS, query)
    assert (caught.value.code, caught.value.status, caught.value.param) == (
        "invalid_request",
        400,
        param,
    )
