"""A replica is disposable (spec §17): two real ``serve`` replicas, each with
its own worker (a simulator), on one PostgreSQL, one Redis and one staging
directory, behind a random-per-connection balancer standing in for the
Kubernetes Service (no session affinity). What a caller created through one
replica works through any of them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.evidence import PNG, WAV, sha
from tests.support.fleet import Fleet, fleet, tenant, until
from tests.support.postgres import PostgresServer
from tests.support.redis import RedisServer
from tests.support.stack import metrics_headers

ALIAS = "gemma-4-mm"
#: a stream that stays before its first event until its caller goes away
HANG = "[[sim first_delay_ms=120000 keepalive_ms=0]]"
TENANTS = {"acme": tenant("acme"), "globex": tenant("globex")}


def _chat(evidence_id: str, text: str = "describe", stream: bool = False) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "max_tokens": 5,
        "stream": stream,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {"type": "image_url", "image_url": {"url": f"evidence:{evidence_id}"}},
                ],
            }
        ],
    }


async def _upload(client: httpx.AsyncClient, data: bytes, content_type: str) -> dict[str, Any]:
    response = await client.post(
        "/v1/evidence", content=data, headers={"content-type": content_type}
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_evidence_works_through_any_replica(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    async with (
        fleet(tmp_path, monkeypatch, postgres_dsn, shared_redis, TENANTS) as f,
        f.client() as client,
        f.client("globex") as other,
    ):
        records = [await _upload(client, PNG, "image/png"), await _upload(client, WAV, "audio/wav")]
        again = [
            await client.post("/v1/evidence", content=PNG, headers={"content-type": "image/png"})
            for _ in range(6)
        ]
        chats = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=_chat(records[0]["id"])) for _ in range(20))
        )
        gets = [await client.get(f"/v1/evidence/{records[i % 2]['id']}") for i in range(20)]
        listed = [(await client.get("/v1/evidence")).json()["data"] for _ in range(10)]
        foreign = await other.get(f"/v1/evidence/{records[0]['id']}")
    # both replicas served: the balancer spread the connections
    assert all(n > 0 for n in f.balancer.picked.values()) and len(f.balancer.picked) == 2
    assert [c.status_code for c in chats] == [200] * 20
    assert [g.status_code for g in gets] == [200] * 20
    # dedup is fleet-wide: the same bytes again are the same record, through any replica
    assert {(a.status_code, a.json()["id"]) for a in again} == {(200, records[0]["id"])}
    assert {len(page) for page in listed} == {2}
    assert foreign.status_code == 404  # another tenant's id looks unknown
    # each worker saw the staged bytes, never a caller's URL
    served = [len([r for r in sim.requests() if r.method == "POST"]) for sim in f.sims]
    assert sum(served) == 20 and min(served) > 0


async def test_a_delete_through_one_replica_forgets_the_record_everywhere(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    quota = {"max_records": 3, "max_bytes": 1 << 20}
    tenants = {"acme": tenant("acme", evidence=quota)}
    async with (
        fleet(tmp_path, monkeypatch, postgres_dsn, shared_redis, tenants) as f,
        f.client() as client,
    ):
        made = [
            await _upload(client, data, kind)
            for data, kind in ((PNG, "image/png"), (WAV, "audio/wav"))
        ]
        deleted = [(await client.delete(f"/v1/evidence/{r['id']}")).status_code for r in made]
        seen = []
        for index in range(2):
            async with f.direct(index) as direct:
                seen += [(await direct.get(f"/v1/evidence/{r['id']}")).status_code for r in made]
                seen.append(len((await direct.get("/v1/evidence")).json()["data"]))
        # the quota counts none of them any more: three fresh uploads fit
        fresh = [
            (
                await client.post(
                    "/v1/evidence",
                    content=PNG + bytes([i]),
                    headers={"content-type": "image/png"},
                )
            ).status_code
            for i in range(4)
        ]
    assert deleted == [204, 204]
    assert seen == [404, 404, 0, 404, 404, 0]
    assert fresh == [201, 201, 201, 403]
    assert not (f.staging / f"{sha(WAV)}.wav").exists()


async def test_quotas_hold_exactly_under_concurrent_uploads_through_both_replicas(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    quota = {"max_records": 5, "max_bytes": 1 << 20}
    tenants = {"acme": tenant("acme", evidence=quota)}
    async with (
        fleet(tmp_path, monkeypatch, postgres_dsn, shared_redis, tenants) as f,
        f.client() as client,
    ):
        answers = await asyncio.gather(
            *(
                client.post(
                    "/v1/evidence",
                    content=PNG + i.to_bytes(2, "big"),
                    headers={"content-type": "image/png"},
                )
                for i in range(16)
            )
        )
        listed = (await client.get("/v1/evidence", params={"limit": 100})).json()["data"]
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 5 + [403] * 11
    assert len(listed) == 5


async def test_a_delete_while_another_replicas_request_holds_the_lease(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    async with (
        fleet(tmp_path, monkeypatch, postgres_dsn, shared_redis, TENANTS) as f,
        f.direct(0) as first,
        f.direct(1) as second,
    ):
        record = await _upload(first, PNG, "image/png")
        path = f.staging / f"{sha(PNG)}.png"
        body = _chat(record["id"], HANG, stream=True)
        # Held before its first event: the lease is taken, the worker is playing it.
        held = asyncio.create_task(first.post("/v1/chat/completions", json=body))
        await until(lambda: _has_request(f, 0), "the worker received the held request")
        assert (await second.delete(f"/v1/evidence/{record['id']}")).status_code == 204
        after = [(await c.get(f"/v1/evidence/{record['id']}")).status_code for c in (first, second)]
        kept_while_held = await anyio.Path(path).exists()
        held.cancel()  # the caller goes away: the request ends, its lease with it
        with contextlib.suppress(asyncio.CancelledError):
            await held
        # the request ended: whichever replica sees it first removes the file
        took = await until(lambda: _gone(path), "the file removed once the lease ended", 10)
    assert after == [404, 404]
    assert kept_while_held
    print(f"\nfile removed {took:.2f} s after the lease ended")


async def _has_request(f: Fleet, index: int) -> bool:
    return any(r.method == "POST" for r in f.sims[index].requests())


async def _gone(path: Path) -> bool:
    return not await anyio.Path(path).exists()


async def test_a_chat_that_names_no_evidence_makes_no_state_call(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    async with fleet(tmp_path, monkeypatch, postgres_dsn, shared_redis, TENANTS, count=1) as f:
        replica = f.replicas[0]
        async with f.direct(0) as client:
            await _upload(client, PNG, "image/png")  # the store is warm and in use
            before = _state_calls(replica)
            for stream in (False, True):
                body = {
                    "model": ALIAS,
                    "max_tokens": 5,
                    "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            after = _state_calls(replica)
    assert before > 0
    assert after == before


def _state_calls(replica: Any) -> float:
    """Every state call the replica made so far, whatever its operation."""
    with httpx.Client(base_url=replica.url, timeout=5) as client:
        text = client.get("/metrics", headers=metrics_headers()).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gateway_state_store_seconds_count"
    )


async def test_a_postgres_outage_is_state_unavailable_for_what_needs_state_only(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    own_postgres: PostgresServer,
    shared_redis: RedisServer,
) -> None:
    timeout_ms = 500
    state = {"timeout_ms": timeout_ms}
    async with (
        fleet(tmp_path, monkeypatch, own_postgres.dsn, shared_redis, TENANTS, state=state) as f,
        f.client() as client,
    ):
        kept = await _upload(client, PNG, "image/png")
        own_postgres.pause()
        try:
            began = time.monotonic()
            refused = await client.post(
                "/v1/evidence", content=WAV, headers={"content-type": "audio/wav"}
            )
            refused_s = time.monotonic() - began
            named = await client.post("/v1/chat/completions", json=_chat(kept["id"]))
            plain = await client.post(
                "/v1/chat/completions",
                json={
                    "model": ALIAS,
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            ready = [(await client.get("/readyz")) for _ in range(4)]
        finally:
            own_postgres.resume()
        recovered = await until(lambda: _uploads(client), "uploads work again", 15)
        listed = (await client.get("/v1/evidence")).json()["data"]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "state_unavailable"
    assert refused_s < timeout_ms / 1000 + 1.0
    assert named.status_code == 503 and named.json()["error"]["code"] == "state_unavailable"
    assert plain.status_code == 200
    assert {r.status_code for r in ready} == {200}
    assert any(r.json().get("degraded") == ["state_unavailable"] for r in ready)
    assert kept["id"] in {r["id"] for r in listed}  # nothing lost
    print(f"\nrefused in {refused_s * 1000:.0f} ms; recovered {recovered:.2f} s after SIGCONT")


async def _uploads(client: httpx.AsyncClient) -> bool:
    answer = await client.post("/v1/evidence", content=WAV, headers={"content-type": "audio/wav"})
    return answer.status_code in (200, 201)


def _responses_posts(f: Fleet) -> int:
    return sum(1 for sim in f.sims for r in sim.requests() if r.path == "/v1/responses")


async def test_while_the_store_is_known_down_what_needs_it_is_refused_before_the_worker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    own_postgres: PostgresServer,
    shared_redis: RedisServer,
) -> None:
    """Spec §24: once a state call failed (``/readyz`` degraded), a streamed
    Responses request that would be kept is 503 ``state_unavailable`` before
    the worker sees it (once it ran there, then ended with
    ``response.completed`` and an error event); so are a kept non-streamed
    one, a follow-up and a chat naming evidence. What needs no state is served,
    and the probe ends the refusals when the store is back, without a request."""
    state = {"timeout_ms": 500}
    async with (
        fleet(
            tmp_path, monkeypatch, own_postgres.dsn, shared_redis, TENANTS, count=1, state=state
        ) as f,
        f.direct(0) as client,
    ):
        kept = await _upload(client, PNG, "image/png")
        first = await client.post("/v1/responses", json={"model": ALIAS, "input": "one"})
        assert first.status_code == 200
        own_postgres.pause()
        try:
            known = await client.get("/v1/evidence")  # a state call fails: known down
            assert known.json()["error"]["code"] == "state_unavailable"
            ready = await client.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["degraded"] == ["state_unavailable"]
            before = _responses_posts(f)
            refused = [
                await client.post("/v1/responses", json=body)
                for body in (
                    {"model": ALIAS, "input": "kept", "stream": True},
                    {"model": ALIAS, "input": "kept"},
                    {"model": ALIAS, "input": "next", "previous_response_id": first.json()["id"]},
                )
            ]
            refused.append(await client.post("/v1/chat/completions", json=_chat(kept["id"])))
            assert _responses_posts(f) == before, "a request that needs state reached the worker"
            unkept = await client.post(
                "/v1/responses",
                json={"model": ALIAS, "input": "unkept", "stream": True, "store": False},
            )
            assert unkept.status_code == 200 and "response.completed" in unkept.text
            assert _responses_posts(f) == before + 1
        finally:
            own_postgres.resume()

        async def not_degraded() -> bool:
            return "degraded" not in (await client.get("/readyz")).json()

        await until(not_degraded, "the probe saw the store answer", 15)
        again = await client.post(
            "/v1/responses", json={"model": ALIAS, "input": "kept", "stream": True}
        )
    for answer in refused:
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"].startswith("application/json")
        assert answer.json()["error"]["code"] == "state_unavailable"
    assert again.status_code == 200
    assert "response.completed" in again.text and "event: error" not in again.text
