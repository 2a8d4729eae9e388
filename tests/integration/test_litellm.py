"""LiteLLM's ``responses()`` against the real gateway in front of the protocol
simulator: a second client library that builds typed Responses output items
(``openai.types.responses`` models) from what the gateway sends, so a field the
worker leaves out (``annotations``, ``item_id``, ``tool_choice``…) shows here.

LiteLLM is imported with ``LITELLM_LOCAL_MODEL_COST_MAP=True``, so it reads its
bundled price map instead of fetching one; it calls nothing but the gateway.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.stack import API_KEY, Stack, running_stack, worker_posts

# LiteLLM's stream logging dumps its own usage object (converted to chat usage) and
# pydantic warns about that model's field type; under filterwarnings=error it would
# print a caught traceback. Nothing the gateway sent is involved.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Pydantic serializer warnings:UserWarning:pydantic.main"
)
ALIAS = "gemma-4-mm"
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]


@pytest.fixture(scope="module")
def litellm() -> Any:
    mp = pytest.MonkeyPatch()
    mp.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        return importlib.import_module("litellm")
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    try:
        with running_stack(
            tmp_path_factory.mktemp("litellm"), acme={"endpoints": ["responses", "models"]}
        ) as running:
            yield running
    finally:
        mp.undo()


def responses(litellm: Any, stack: Stack, **request: Any) -> Any:
    return litellm.responses(
        model=f"openai/{ALIAS}", api_base=stack.url + "/v1", api_key=API_KEY, **request
    )


def test_output_items_are_typed(litellm: Any, stack: Stack) -> None:
    response = responses(litellm, stack, input="hi [[sim chunks=3]]")
    assert response.status == "completed"
    [message] = response.output
    assert isinstance(message, ResponseOutputMessage)
    part = message.content[0]
    assert isinstance(part, ResponseOutputText) and part.annotations == []
    assert part.text == "sim-token-0 sim-token-1 sim-token-2 "
    assert response.usage.input_tokens > 0 and response.usage.output_tokens == 3
    sent = worker_posts(stack.sim)[-1]
    assert sent.path == "/v1/responses"
    assert isinstance(sent.json, dict) and sent.json["stream"] is True


def test_a_function_call_item(litellm: Any, stack: Stack) -> None:
    response = responses(litellm, stack, input="weather? [[sim tool_call=1]]", tools=TOOLS)
    calls = [item for item in response.output if isinstance(item, ResponseFunctionToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [("lookup", '{"q":1}')]
    assert calls[0].call_id.startswith("call_")  # the gateway's (spec §24), not call-<uuid>
    assert calls[0].id is not None and calls[0].id.startswith("fc_")


def test_a_stream_names_its_items(litellm: Any, stack: Stack) -> None:
    stream = responses(litellm, stack, input="hi [[sim chunks=2]]", stream=True)
    seen = list(stream)
    added = [e for e in seen if e.type == "response.output_item.added"]
    deltas = [e for e in seen if e.type == "response.output_text.delta"]
    assert added and deltas
    assert {d.item_id for d in deltas} == {added[0].item.id}
    assert "".join(d.delta for d in deltas) == "sim-token-0 sim-token-1 "
    final = seen[-1]
    assert final.type == "response.completed"
    assert final.response.output[0].content[0].text == "sim-token-0 sim-token-1 "
