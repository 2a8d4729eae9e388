"""Responses and their conversations through any replica (spec §17): two real
``serve`` replicas, each with its own worker, on one PostgreSQL, behind a
random-per-connection balancer; the OpenAI SDK is the client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.fleet import Fleet, fleet, tenant
from tests.support.redis import RedisServer

ALIAS = "gemma-4-mm"
TENANTS = {"acme": tenant("acme"), "globex": tenant("globex")}


def _sdk(f: Fleet, name: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f.balancer.url + "/v1",
        api_key=f.replicas[0].dev_token(name),
        max_retries=0,
        # A new connection per request: each lands on any replica.
        default_headers={"connection": "close"},
    )


def _worker_inputs(f: Fleet, marker: str) -> list[list[Any]]:
    """The ``input`` of every Responses request the workers received carrying ``marker``."""
    found = []
    for sim in f.sims:
        for request in sim.requests():
            if request.path == "/v1/responses" and marker.encode() in request.body:
                assert isinstance(request.json, dict)
                assert request.json["store"] is False
                assert "previous_response_id" not in request.json
                found.append(request.json["input"])
    return found


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


async def _sequence(sdk: openai.AsyncOpenAI, n: int) -> str:
    first = await sdk.responses.create(model=ALIAS, input=f"seq{n} one [[sim chunks=2]]")
    second = await sdk.responses.create(
        model=ALIAS, input=f"seq{n} two", previous_response_id=first.id
    )
    fetched = await sdk.responses.retrieve(second.id)
    assert fetched.id == second.id and fetched.output_text == second.output_text
    items = await sdk.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["message"]
    await sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(first.id)
    return second.id


async def test_twenty_response_sequences_through_random_replicas_all_succeed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    async with fleet(tmp_path, monkeypatch, postgres_dsn, shared_redis, TENANTS) as f:
        sdk = _sdk(f)
        outcomes = await asyncio.gather(
            *(_sequence(sdk, n) for n in range(20)), return_exceptions=True
        )
        # another tenant cannot name them
        other = _sdk(f, "globex")
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(str(outcomes[0]))
        await sdk.close()
        await other.close()
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    assert failures == []
    assert len(f.balancer.picked) == 2 and min(f.balancer.picked.values()) > 10


async def test_a_worker_restart_keeps_every_conversation(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    async with fleet(tmp_path, monkeypatch, postgres_dsn, shared_redis, TENANTS) as f:
        sdk = _sdk(f)
        last = None
        for turn in range(5):
            last = await sdk.responses.create(
                model=ALIAS,
                input=f"restart-{turn} " + "x" * 200,
                previous_response_id=None if last is None else last.id,
            )
        for sim in f.sims:
            sim.reset()  # every worker forgets everything it ever kept, as a restart does
        assert last is not None
        after = await sdk.responses.create(
            model=ALIAS, input="restart-after", previous_response_id=last.id
        )
        await sdk.close()
    sent = _worker_inputs(f, "restart-after")
    assert len(sent) == 1
    users = [_text(i["content"]) for i in sent[0] if i.get("role") == "user"]
    assert len(users) == 6 and users[0].startswith("restart-0")
    assert after.usage is not None and after.usage.input_tokens > 5 * 50
