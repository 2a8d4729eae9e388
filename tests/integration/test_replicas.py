"""N real ``serve`` replicas on one real Redis admit what one would (spec §15).

Two or three ``mistralrs-gateway serve`` processes share one redis-server
(loopback, no persistence) in front of one protocol simulator; requests are
spread over them concurrently (asyncio, bounded). Nothing here asserts on
time taken but what §15 promises in seconds (a dead replica's slots are free
within ``lease_ttl_s``, run with short leases): where the refill of a bucket
during a burst matters, the bound is computed from the burst's measured
window (exact while the window is shorter than one refill), and the figures
are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from gateway.ratelimit import tenant_keys
from gateway.ratelimit.core import seconds_until_midnight
from tests.ratelimit.conftest import away_from_midnight
from tests.support.poll import eventually_async
from tests.support.process import Served, metric, serve, serving, sim_running
from tests.support.redis import RedisServer
from tests.support.replicas import (
    FAST_LEASES,
    HANG,
    LEASE_RENEW_S,
    LEASE_TTL_S,
    PREFIX,
    REPLICA_WAIT_S,
    chat,
    clients,
    code,
    day_used,
    fleet_configs,
    hold_streams,
    marked,
    peak_overlap,
    receipts,
    reservation,
    settled,
    slot_leases_left_ms,
    slots_held,
    tenant_policy,
)


def _ready(replica: Served) -> tuple[int, dict[str, object]]:
    """Status and body without the per-route states (only the limits store
    comes and goes here)."""
    response = httpx.get(f"{replica.url}/readyz", timeout=5)
    body = response.json()
    body.pop("routes")
    return response.status_code, body


async def _all_ready(replicas: list[Served]) -> None:
    await eventually_async(
        lambda: all(_ready(r)[0] == 200 for r in replicas),
        "every replica ready",
        timeout_s=REPLICA_WAIT_S,
    )


def _metric(replica: Served, name: str, /, scrape_as: str = "acme", **labels: str) -> float:
    with httpx.Client(base_url=replica.url) as client:
        return metric(client, name, scrape_as=scrape_as, **labels)


async def _receipts(replicas: list[Served], count: int) -> list[dict[str, object]]:
    """The replicas' receipts once ``count`` are written (the writer batches)."""
    await eventually_async(
        lambda: len(receipts(replicas)) >= count, f"{count} receipts", timeout_s=REPLICA_WAIT_S
    )
    return receipts(replicas)


async def _burst(
    targets: list[httpx.AsyncClient], text: str, count: int
) -> tuple[list[httpx.Response], float]:
    """``count`` concurrent requests, round robin over ``targets``; answers and window (s)."""
    started = time.monotonic()
    async with asyncio.timeout(60):
        answers = await asyncio.gather(
            *(chat(targets[i % len(targets)], text) for i in range(count))
        )
    return list(answers), time.monotonic() - started


@pytest.mark.parametrize("count", [2, 3])
async def test_requests_per_minute_across_replicas_is_what_one_admits(
    tmp_path: Path, redis_url: str, shared_redis: RedisServer, count: int
) -> None:
    rpm = 12  # one refill every 5 s: a burst shorter than that admits exactly rpm
    tenants = {name: tenant_policy(name, requests_per_minute=rpm) for name in ("acme", "globex")}
    with sim_running() as sim:
        configs = fleet_configs(tmp_path, count, sim=sim, redis=shared_redis, tenants=tenants)
        with serving(configs) as replicas:
            await _all_ready(replicas)
            async with clients(replicas, "acme") as acme, clients(replicas, "globex") as globex:
                # x-ratelimit-* come from the shared bucket: the second replica sees
                # the first one's request
                started = time.monotonic()
                first, second = await chat(acme[0], "hdr"), await chat(acme[1], "hdr")
                gap = time.monotonic() - started
                answers, _ = await _burst(acme, "rpm", 3 * rpm)
                window = time.monotonic() - started
                # one replica alone, another tenant, the same limit
                alone, alone_window = await _burst(globex[:1], "rpm", 3 * rpm)
    # x-ratelimit-* come from the shared bucket: the second replica saw the
    # first one's request (a fresh bucket holds rpm; one refill every 5 s)
    assert first.headers["x-ratelimit-remaining-requests"] == str(rpm - 1)
    second_left = int(second.headers["x-ratelimit-remaining-requests"])
    assert rpm - 2 <= second_left <= rpm - 2 + math.floor(gap * rpm / 60)
    assert first.headers["x-ratelimit-limit-requests"] == "12"
    assert second.headers["x-ratelimit-limit-requests"] == "12"
    codes = Counter(code(a) for a in answers)
    alone_codes = Counter(code(a) for a in alone)
    assert set(codes) <= {"ok", "rate_limited"} and set(alone_codes) == set(codes)
    admitted = codes["ok"] + 2
    assert rpm <= admitted <= rpm + math.floor(window * rpm / 60)
    assert rpm <= alone_codes["ok"] <= rpm + math.floor(alone_window * rpm / 60)
    refused = [a for a in answers if a.status_code == 429]
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert all(r.headers["x-ratelimit-remaining-requests"] == "0" for r in refused)
    print(
        f"\nrpm {rpm}, {count} replicas: admitted {admitted} of {3 * rpm + 2} in {window:.2f} s;"
        f" one replica alone: {alone_codes['ok']} of {3 * rpm} in {alone_window:.2f} s"
    )


@pytest.mark.parametrize("count", [2, 3])
async def test_tokens_per_minute_across_replicas_within_one_reservation(
    tmp_path: Path, shared_redis: RedisServer, redis_url: str, count: int
) -> None:
    tpm, max_tokens = 2000, 200
    text = f"tpm{count} {HANG}"
    need = reservation(text, max_tokens)
    tenants = {"acme": tenant_policy("acme", tokens_per_minute=tpm)}
    with sim_running() as sim:
        configs = fleet_configs(tmp_path, count, sim=sim, redis=shared_redis, tenants=tenants)
        with serving(configs) as replicas:
            await _all_ready(replicas)
            async with clients(replicas, "acme") as acme:
                # Admitted requests hang at the simulator, holding their reservation
                # (nothing is refunded during the burst); refusals answer at once.
                started = time.monotonic()
                tasks = [
                    asyncio.create_task(chat(acme[i % count], text, max_tokens=max_tokens))
                    for i in range(3 * tpm // need)
                ]

                def decided() -> bool:
                    done = sum(1 for t in tasks if t.done())
                    return done + len(marked(sim, text[:4])) == len(tasks)

                await eventually_async(
                    decided, "every request admitted or refused", timeout_s=REPLICA_WAIT_S
                )
                window = time.monotonic() - started
                admitted = len(marked(sim, text[:4]))
                answers = [t.result() for t in tasks if t.done()]
                for task in tasks:
                    task.cancel()  # the callers go away: the gateways settle
                await asyncio.gather(*tasks, return_exceptions=True)
            await eventually_async(
                lambda: settled(shared_redis, "acme"),
                "every hold settled",
                timeout_s=REPLICA_WAIT_S,
            )
    assert {code(a) for a in answers} == {"rate_limited"}
    taken = admitted * need
    # Never more than the minute (plus its refill in the window), never short
    # of it by a whole reservation.
    assert tpm - need < taken <= tpm + window * tpm / 60
    print(
        f"\ntpm {tpm}, {count} replicas, {need} tokens each: admitted {admitted}"
        f" ({taken} tokens) of {len(tasks)} in {window:.2f} s"
    )


async def test_tokens_per_day_refuses_with_retry_after_to_utc_midnight(
    tmp_path: Path, shared_redis: RedisServer, redis_url: str
) -> None:
    away_from_midnight()
    tpd, max_tokens, text = 150, 20, "tpd"
    need = reservation(text, max_tokens)
    tenants = {"acme": tenant_policy("acme", tokens_per_day=tpd)}
    with sim_running() as sim:
        configs = fleet_configs(tmp_path, 2, sim=sim, redis=shared_redis, tenants=tenants)
        with serving(configs) as replicas:
            await _all_ready(replicas)
            async with clients(replicas, "acme") as acme:
                used = 0
                refusal: httpx.Response | None = None
                for i in range(tpd):  # bounded: every admitted request uses >= 1 token
                    answer = await chat(acme[i % 2], text, max_tokens=max_tokens)
                    if answer.status_code != 200:
                        refusal = answer
                        refused_at = time.time()
                        break
                    used += answer.json()["usage"]["total_tokens"]
                    # the next decision sees this request's real usage, not its hold
                    await eventually_async(
                        lambda: settled(shared_redis, "acme"), "settled", timeout_s=REPLICA_WAIT_S
                    )
                    assert day_used(shared_redis, "acme") == used
                assert refusal is not None
                # every replica refuses now
                others = [await chat(client, text, max_tokens=max_tokens) for client in acme]
            # the admitted requests, the refusal and the two after it
            assert len(await _receipts(replicas, i + 3)) == i + 3
    assert refusal.status_code == 429
    assert refusal.json()["error"]["code"] == "budget_exhausted"
    retry = int(refusal.headers["Retry-After"])
    assert abs(retry - math.ceil(seconds_until_midnight(refused_at))) <= 2
    assert [code(a) for a in others] == ["budget_exhausted"] * 2
    # the replicas together charged exactly the real usage, within the budget,
    # and refused only what would have passed it
    assert used <= tpd < used + need
    print(f"\ntpd {tpd}: {i} requests used {used} tokens; refused with Retry-After {retry}")


async def test_max_concurrent_requests_holds_across_replicas_under_50_streams(
    tmp_path: Path, shared_redis: RedisServer, redis_url: str
) -> None:
    limit, streams, text = 4, 50, "conc [[sim chunks=4 delay_ms=50]]"
    tenants = {"acme": tenant_policy("acme", max_concurrent_requests=limit)}
    with sim_running() as sim:
        configs = fleet_configs(tmp_path, 3, sim=sim, redis=shared_redis, tenants=tenants)
        with serving(configs) as replicas:
            await _all_ready(replicas)
            refusals: Counter[str] = Counter()
            attempts = 0

            async def stream(client: httpx.AsyncClient, index: int) -> None:
                # each caller retries (bounded) until one stream of its own got through
                nonlocal attempts
                for _ in range(200):
                    attempts += 1
                    answer = await chat(client, text, stream=True)
                    if answer.status_code == 200:
                        assert answer.text.endswith("data: [DONE]\n\n")
                        return
                    refusals[code(answer)] += 1
                    assert answer.headers["Retry-After"] == "1"
                    await asyncio.sleep(0.05 + 0.002 * index)  # a caller's pause (not a wait)
                raise AssertionError("a caller never got a slot")

            started = time.monotonic()
            async with clients(replicas, "acme") as acme, asyncio.timeout(120):
                await asyncio.gather(*(stream(acme[i % 3], i) for i in range(streams)))
            window = time.monotonic() - started
            await eventually_async(
                lambda: slots_held(shared_redis, "acme") == 0,
                "every slot freed",
                timeout_s=REPLICA_WAIT_S,
            )
    seen = marked(sim, "conc")
    assert len(seen) == streams  # refused requests never reached the worker
    peak = peak_overlap(seen)
    assert 1 <= peak <= limit
    assert set(refusals) == {"concurrency_limited"}
    print(
        f"\nmax_concurrent {limit}, {streams} callers on 3 replicas: peak {peak} at the"
        f" worker, {attempts} attempts, {refusals['concurrency_limited']} refused,"
        f" {window:.2f} s"
    )


async def test_a_restarted_replica_keeps_the_tenants_remaining_budget(
    tmp_path: Path, shared_redis: RedisServer, redis_url: str
) -> None:
    rpm, tpd, max_tokens = 10, 10**6, 100  # rpm refills one request every 6 s
    tenants = {"acme": tenant_policy("acme", requests_per_minute=rpm, tokens_per_day=tpd)}
    with sim_running() as sim:
        (config,) = fleet_configs(tmp_path, 1, sim=sim, redis=shared_redis, tenants=tenants)
        started = time.monotonic()
        with serve(config, config.parent) as first:
            await _all_ready([first])
            async with clients([first], "acme") as (client,):
                for _ in range(6):
                    before = await chat(client, "restart", max_tokens=max_tokens)
                    assert before.status_code == 200
                spent = time.monotonic() - started
            assert first.terminate() == 0  # mid-minute
            used_before = day_used(shared_redis, "acme")
        (tmp_path / "again").mkdir()
        with serve(config, tmp_path / "again") as second:
            await _all_ready([second])
            async with clients([second], "acme") as (client,):
                after = await chat(client, "restart", max_tokens=max_tokens)
                admitted = 6 + 1
                for _ in range(2 * rpm):  # spend the rest of the minute
                    if (await chat(client, "restart", max_tokens=max_tokens)).status_code != 200:
                        break
                    admitted += 1
            await eventually_async(
                lambda: settled(shared_redis, "acme"), "settled", timeout_s=REPLICA_WAIT_S
            )
            # (one audit file: the same config, restarted)
            written = await _receipts([second], admitted + 1)
        window = time.monotonic() - started
    refill = math.floor(window * rpm / 60)
    left_before = int(before.headers["x-ratelimit-remaining-requests"])
    assert rpm - 6 <= left_before <= rpm - 6 + math.floor(spent * rpm / 60)
    remaining = int(after.headers["x-ratelimit-remaining-requests"])
    assert rpm - 7 <= remaining <= rpm - 7 + refill
    assert rpm <= admitted <= rpm + refill
    # the day's counter too: both processes' real usage, nothing lost in between
    usage = [r["usage"]["total_tokens"] for r in written if r["outcome"] == "complete"]  # type: ignore[index]
    assert 0 < used_before < day_used(shared_redis, "acme") == sum(usage)
    print(f"\nrestart: remaining {remaining} after it; {admitted} admitted in {window:.1f} s")


async def test_a_killed_replicas_slot_expires_while_its_tokens_stay_charged(
    tmp_path: Path, shared_redis: RedisServer, redis_url: str
) -> None:
    tpm, doomed_tokens, small = 1200, 990, 50
    tenants = {"acme": tenant_policy("acme", tokens_per_minute=tpm, max_concurrent_requests=1)}
    doomed_text = f"doomed {HANG}"
    with sim_running() as sim:
        configs = fleet_configs(
            tmp_path,
            2,
            sim=sim,
            redis=shared_redis,
            tenants=tenants,
            store=FAST_LEASES,
            # a slot's lease no longer follows the longest a request may run
            upstream={"total_timeout_s": 600},
        )
        with serving(configs) as (doomed, survivor):
            await _all_ready([doomed, survivor])
            async with clients([doomed, survivor], "acme") as (to_doomed, to_survivor):
                sent_at = time.monotonic()
                hanging = asyncio.create_task(chat(to_doomed, doomed_text, max_tokens=990))
                await eventually_async(
                    lambda: bool(marked(sim, "doomed")),
                    "the stream at the worker",
                    timeout_s=REPLICA_WAIT_S,
                )
                doomed.signal(signal.SIGKILL)  # nothing is settled
                doomed.proc.wait(10)
                killed_at = time.monotonic()
                # the dead replica's slot holds at most one lease, by Redis' clock
                [left_ms] = slot_leases_left_ms(shared_redis, "acme")
                assert 0 < left_ms <= LEASE_TTL_S * 1000
                with pytest.raises(httpx.HTTPError):
                    await hanging
                refused = await chat(to_survivor, "survivor", max_tokens=small)
                assert code(refused) == "concurrency_limited"
                attempts = 1
                admitted: httpx.Response | None = None
                deadline = killed_at + LEASE_TTL_S + 20
                while admitted is None and time.monotonic() < deadline:
                    answer = await chat(to_survivor, "survivor", max_tokens=small)
                    attempts += 1
                    if answer.status_code == 200:
                        admitted = answer
                    else:
                        assert code(answer) == "concurrency_limited"
                        await asyncio.sleep(0.2)  # a caller's retry pause
                admitted_at = time.monotonic()
    assert admitted is not None, "the dead replica's slot never expired"
    freed_after, waited = admitted_at - killed_at, admitted_at - sent_at
    assert freed_after <= LEASE_TTL_S + 2
    # The doomed reservation was never refunded: at most the refill since it came back.
    need = reservation("survivor", small)
    remaining = int(admitted.headers["x-ratelimit-remaining-tokens"])
    assert remaining <= tpm - reservation(doomed_text, doomed_tokens) + waited * tpm / 60 - need + 1
    print(
        f"\nSIGKILL: the slot came back {freed_after:.1f} s after the kill (lease_ttl_s"
        f" {LEASE_TTL_S}, {attempts} attempts); tokens remaining {remaining}"
    )


async def test_a_killed_replica_frees_its_four_streams_slots_within_lease_ttl_s(
    tmp_path: Path, shared_redis: RedisServer, redis_url: str
) -> None:
    """Issue 21: replica A holds 4 of the tenant's 8 slots with hanging streams
    and is SIGKILLed. While A lives, its renewals keep the 4 past lease_ttl_s
    and B gets only the other 4; after the kill B admits all 8 within
    lease_ttl_s + 2 s, although total_timeout_s is 600 s (the old leases lasted
    total_timeout_s + 10 s + the queue wait: 615 s)."""
    limit = 8
    tenants = {"acme": tenant_policy("acme", max_concurrent_requests=limit)}
    streams: list[asyncio.Task[httpx.Response]] = []
    with sim_running() as sim:
        configs = fleet_configs(
            tmp_path,
            2,
            sim=sim,
            redis=shared_redis,
            tenants=tenants,
            store=FAST_LEASES,
            upstream={"total_timeout_s": 600},
        )
        with serving(configs) as (doomed, survivor):
            await _all_ready([doomed, survivor])
            async with clients([doomed, survivor], "acme") as (to_doomed, to_survivor):
                try:
                    on_a, refused = await hold_streams(to_doomed, sim, "a", 4, REPLICA_WAIT_S)
                    streams += on_a
                    assert refused == 0
                    # A renews: for longer than a lease its 4 slots stay taken
                    renewed_until = time.monotonic() + LEASE_TTL_S + LEASE_RENEW_S
                    while time.monotonic() < renewed_until:
                        leases = slot_leases_left_ms(shared_redis, "acme")
                        assert len(leases) == 4
                        assert all(0 < ms <= LEASE_TTL_S * 1000 for ms in leases)
                        await asyncio.sleep(0.1)  # (watching, not waiting for a state)
                    on_b, refused = await hold_streams(to_survivor, sim, "b", 4, REPLICA_WAIT_S)
                    streams += on_b
                    assert refused == 0
                    over = await chat(to_survivor, "over the limit", stream=True)
                    assert code(over) == "concurrency_limited"
                    doomed.signal(signal.SIGKILL)  # by its PID: nothing is settled
                    doomed.proc.wait(10)
                    killed_at = time.monotonic()
                    more, refused = await hold_streams(
                        to_survivor, sim, "c", 4, LEASE_TTL_S + REPLICA_WAIT_S
                    )
                    freed_after = time.monotonic() - killed_at
                    streams += more
                    assert slots_held(shared_redis, "acme") == limit  # all of them B's
                    at_worker = [r for r in marked(sim, "<") if r.finished_at is None]
                    assert len(at_worker) >= limit  # B's 8 (A's 4 may not have ended yet)
                finally:
                    for task in streams:
                        task.cancel()  # the callers go away: B settles its 8
                    await asyncio.gather(*streams, return_exceptions=True)
            await eventually_async(
                lambda: slots_held(shared_redis, "acme") == 0,
                "every slot freed",
                timeout_s=REPLICA_WAIT_S,
            )
    assert freed_after <= LEASE_TTL_S + 2
    # not before A's last renewal's lease ended (Redis' clock vs ours)
    assert freed_after >= LEASE_TTL_S - LEASE_RENEW_S - 0.5
    assert refused >= 1  # B's caller met A's slots before they expired
    print(
        f"\nSIGKILL with 4 streams: B admitted {limit} concurrent streams"
        f" {freed_after:.2f} s after the kill (lease_ttl_s {LEASE_TTL_S},"
        f" lease_renew_s {LEASE_RENEW_S}, total_timeout_s 600; {refused} refusals)"
    )


async def test_a_redis_outage_mid_run_under_closed_and_open(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    tenants = {"acme": tenant_policy("acme", requests_per_minute=6000, tokens_per_minute=10**6)}
    with sim_running() as sim:
        closed_cfg, open_cfg = (
            fleet_configs(
                tmp_path / mode,
                1,
                sim=sim,
                redis=own_redis,
                tenants=tenants,
                # Redis stopped refuses at once, so the bound costs no time here; a
                # tight one would turn a slow first call after the restart (a new
                # connection, SCRIPT LOAD) on a loaded machine into a second episode.
                store={"timeout_ms": 2000, "on_error": mode, "unready_after_s": 0.5},
            )[0]
            for mode in ("closed", "open")
        )
        with serving([closed_cfg, open_cfg]) as replicas:
            closed, opened = replicas
            await _all_ready(replicas)
            async with clients(replicas, "acme") as (to_closed, to_open):
                answers = await asyncio.gather(
                    *(chat(c, "outage") for c in (to_closed, to_open) * 4)
                )
                assert [code(a) for a in answers] == ["ok"] * 8
                # a stream in flight when Redis goes away
                slow = asyncio.create_task(
                    chat(to_closed, "inflight [[sim chunks=5 delay_ms=200]]", stream=True)
                )
                await eventually_async(
                    lambda: bool(marked(sim, "inflight")),
                    "the stream at the worker",
                    timeout_s=REPLICA_WAIT_S,
                )
                own_redis.stop()  # by its PID
                await eventually_async(
                    lambda: _ready(closed)[0] == 503,
                    "closed: /readyz 503",
                    timeout_s=REPLICA_WAIT_S,
                )
                assert _ready(closed)[1]["reason"] == "limits_unavailable"
                during = await asyncio.gather(
                    *(chat(c, "outage") for c in (to_closed, to_open) * 4)
                )
                assert [code(a) for a in during] == ["limits_unavailable", "ok"] * 4
                assert _ready(opened) == (200, {"status": "ready", "draining": False})
                streamed = await slow  # it was admitted: it goes on
                assert streamed.status_code == 200
                assert streamed.text.endswith("data: [DONE]\n\n")
                # its settlement waits in the queue while Redis is away
                await eventually_async(
                    lambda: _metric(closed, "gateway_limits_settlements_pending") >= 1,
                    "a settlement queued",
                    timeout_s=REPLICA_WAIT_S,
                )
                assert _metric(opened, "gateway_limits_store_errors_total", op="reserve") == 4
                own_redis.start()  # the same port
                await eventually_async(
                    lambda: _ready(closed)[0] == 200,
                    "closed: ready again by itself",
                    timeout_s=REPLICA_WAIT_S,
                )
                after = await asyncio.gather(*(chat(c, "outage") for c in (to_closed, to_open)))
                assert [code(a) for a in after] == ["ok", "ok"]
                assert all("x-ratelimit-remaining-requests" in a.headers for a in after)
                await eventually_async(
                    lambda: _metric(closed, "gateway_limits_settlements_pending") == 0,
                    "the queued settlements applied",
                    timeout_s=REPLICA_WAIT_S,
                )
                assert _metric(closed, "gateway_limits_store_errors_total", op="reserve") == 4
                assert _metric(closed, "gateway_limits_store_healthy") == 1
            written = await _receipts([closed], 4 + 1 + 4 + 1)
            closed_log, open_log = closed.stderr_text(), opened.stderr_text()
    rejected = [r["error_code"] for r in written if r["outcome"] == "rejected"]
    assert rejected == ["limits_unavailable"] * 4
    for log in (closed_log, open_log):
        said = [line for line in log.splitlines() if "limits store" in line]
        assert log.count("limits store unavailable") == 1, said  # once per episode
        assert log.count("limits store available again") == 1, said


#: Names at the edges of what policy.TENANT_NAME allows: one character, the
#: longest (63), every allowed punctuation, look-alikes of the store's key
#: parts and of each other's hex spellings (hex("a") is "61").
WIDE_TENANTS = [
    "a",
    "61",
    "3631",
    "0",
    "a.b",
    "a-b",
    "a_b",
    "a.",
    "a..",
    "a-_.",
    "mrgw",
    "rpm",
    "slots",
    "x" * 63,
    "x" * 62 + "y",
    "Z9._-z",
]


async def test_the_widest_tenant_names_never_share_limits(
    tmp_path: Path, shared_redis: RedisServer, redis_url: str
) -> None:
    tenants = {
        n: tenant_policy(n, requests_per_minute=1, tokens_per_day=10**6) for n in WIDE_TENANTS
    }
    with sim_running() as sim:
        configs = fleet_configs(tmp_path, 2, sim=sim, redis=shared_redis, tenants=tenants)
        with serving(configs) as replicas:
            await _all_ready(replicas)
            outcomes: dict[str, list[str]] = {}
            for index, name in enumerate(WIDE_TENANTS):
                async with clients(replicas, name) as pair:
                    first = pair[index % 2]
                    other = pair[(index + 1) % 2]
                    # each tenant's one request passes, on either replica, and only it
                    outcomes[name] = [code(await chat(first, name)), code(await chat(other, name))]
            await eventually_async(
                lambda: all(settled(shared_redis, n) for n in WIDE_TENANTS),
                "settled",
                timeout_s=REPLICA_WAIT_S,
            )
            counted = [
                {
                    name: _metric(
                        replica,
                        "gateway_requests_total",
                        scrape_as=WIDE_TENANTS[0],
                        tenant=name,
                        endpoint="chat.completions",
                        status="200",
                    )
                    for name in WIDE_TENANTS
                }
                for replica in replicas
            ]
            written = await _receipts(replicas, 2 * len(WIDE_TENANTS))
    assert outcomes == {name: ["ok", "rate_limited"] for name in WIDE_TENANTS}
    # metrics: each tenant's one success counted once, on the replica that served it
    for index, name in enumerate(WIDE_TENANTS):
        assert [counted[0][name], counted[1][name]] == ([1, 0] if index % 2 == 0 else [0, 1])
    assert Counter(r["tenant"] for r in written) == {name: 2 for name in WIDE_TENANTS}
    # Redis: every key belongs to exactly one tenant, found from its hex tag
    with shared_redis.client() as client:
        keys = {k.decode() for k in client.scan_iter(match=f"{PREFIX}*", count=1000)}
    # The store's readiness probe writes one key of its own, no tenant's.
    keys.discard(f"{PREFIX}probe")
    owners: dict[str, set[str]] = {}
    for key in keys:
        tag, kind = key[len(PREFIX) + 1 :].split("}:")
        owners.setdefault(bytes.fromhex(tag).decode("utf-8"), set()).add(kind)
    assert owners == {name: {"rpm", "day"} for name in WIDE_TENANTS}
    assert all(tenant_keys(PREFIX, n).requests in keys for n in WIDE_TENANTS)
