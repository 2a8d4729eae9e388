"""The OpenAI surface SDK users call (spec §14), with the official ``openai`` SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.stack import Stack, worker_posts


def _sdk(stack: Stack, token: str | None = None) -> openai.OpenAI:
    return stack.sdk(token)


def test_models_retrieve_and_list_agree(stack: Stack) -> None:
    client = _sdk(stack)
    model = client.models.retrieve("gemma-4-mm")
    assert model.id == "gemma-4-mm" and model.object == "model"
    listed = {m.id: m for m in client.models.list()}
    assert listed["gemma-4-mm"] == model
    # `created` is the worker's unix time, not the host's uptime.
    worker = httpx.get(stack.sim.base_url + "/v1/models", timeout=5).json()["data"]
    assert model.created == worker[-1]["created"] > 1_700_000_000
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-alias")
    assert info.value.code == "model_not_found"


def test_another_tenants_alias_looks_unknown(tmp_path_factory: pytest.TempPathFactory) -> None:
    from gateway.testing.harness import SIM_ROUTE
    from tests.support.stack import running_stack

    directory = tmp_path_factory.mktemp("aliases")
    with running_stack(directory, acme={"models": {"acme-only": SIM_ROUTE}}) as stack:
        assert _sdk(stack).models.retrieve("acme-only").id == "acme-only"
        globex = _sdk(stack, stack.rs256(tenant="globex"))
        with pytest.raises(openai.NotFoundError) as info:
            globex.models.retrieve("acme-only")
        assert info.value.code == "model_not_found"
        assert worker_posts(stack.sim) == []
