"""Chaos soak: many concurrent requests through the real stack while things go wrong.

Hundreds of streaming and non-streaming requests at high concurrency, with
seeded random caller disconnects (mid-body before admission, while queued
behind a small ``admission.capacity``, before the first token, mid-stream),
worker faults on both of two upstreams (a second simulator serves a second
route), a worker outage (connection refused, then a restarted
simulator on the same port), evidence uploads raced by deletes, refused past
the tenant's record quota and expiring under a short ``ttl_s``, and an audit
outage (the receipts' small filesystem filled, then freed) mid-round. A
release (spec §18) splits an alias 50/50 per request between the two
upstreams' routes with fallback on, and Anthropic Messages requests (spec
§19, ``x-api-key`` or Bearer) go to every alias, the release's included.

Afterwards (spec §1.3, §1.4, §1.5): permits and leases are back to 0; every
inference request id has exactly one receipt whose outcome matches what the
caller observed; no failed stream carried ``[DONE]``; open descriptors, the
gateway loop's task count and RSS are back near their baseline; staged files
whose records were all deleted are gone; the release's requests are counted
on both arms and every receipt naming it came through its alias.

``GATEWAY_SOAK=long`` (``make soak``) runs more rounds of more requests; the
default fits CI. Figures are printed (see them with ``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.apis.messages.events import EventGrammar
from gateway.http.server import tune_gc
from gateway.testing.harness import SIM_ROUTE
from gateway.testing.samples import SAMPLES
from gateway.testing.simulator import Simulator
from tests.support.poll import eventually, eventually_async
from tests.support.stack import Stack, chat_body, running_stack, sse_data
from tests.support.tmpfs import fill, free, small_fs

LONG = os.environ.get("GATEWAY_SOAK", "").lower() == "long"
SEED = int(os.environ.get("GATEWAY_SOAK_SEED", "20240807"))
ROUNDS = 6 if LONG else 3
PER_ROUND = 800 if LONG else 200
CONCURRENCY = 64 if LONG else 40
CAPACITY = 8  # small: most of CONCURRENCY waits in the admission queue
PNG = SAMPLES["tiny.png"]()

UPSTREAM = {
    "first_event_timeout_s": 2,
    "idle_timeout_s": 0.6,
    "total_timeout_s": 10,
    "max_line_bytes": 65_536,
    "readiness_poll_s": 0.1,
    "readiness_timeout_s": 0.5,
}
#: the second upstream's route and the alias that reaches it
SECOND_ROUTE = "/srv/mosaic-models/" + "5e" * 32
SECOND_ALIAS = "second-mm"
SECOND_CAPACITY = 4
#: a release over both upstreams (stable: the first's route, canary: the second's)
RELEASE = "soak"
RELEASE_ALIAS = "release-mm"
RELEASES = [
    {
        "name": RELEASE,
        "stable": SIM_ROUTE,
        "canary": SECOND_ROUTE,
        "canary_percent": 50,
        "cohort": "request",
        "fallback": True,
    }
]
ALIASES = ["gemma-4-mm", SECOND_ALIAS, RELEASE_ALIAS]
ALIAS_WEIGHTS = [4, 3, 3]
ACME = {
    "models": {
        "gemma-4-mm": SIM_ROUTE,
        SECOND_ALIAS: SECOND_ROUTE,
        RELEASE_ALIAS: f"release:{RELEASE}",
    },
    "endpoints": ["chat.completions", "completions", "models", "evidence", "messages"],
    "limits": {"max_output_tokens": 512, "requests_per_minute": 1_000_000},
    "admission": {"share": 1, "max_permits": CAPACITY, "queue_timeout_s": 30},
    # Small on purpose: uploads meet the quota, records expire while in use.
    "evidence": {"max_records": 6, "max_bytes": 1_000_000, "ttl_s": 2},
}
STAGING = {
    "dir": "var/evidence",
    "catalog": "var/catalog.sqlite3",
    "max_concurrent_uploads": 4,
    "expiry_sweep_s": 0.25,
}

# Worker faults sampled in the soak, and what the worker does for them.
FAULTS = [
    "close_mid",
    "missing_done",
    "error_json",
    "error_first",
    "id_change",
    "usage_early",
    "after_done",
    "invalid_utf8",
    "hang_mid",
    "json_body",
    "wrong_content_type",
    "gzip",
    "redirect",
    "huge_headers",
    "endless_line",
    "wrong_request_id",
    "status=500",
    "status=422",
    "finish=canceled",
]
# caller-visible code → receipt outcomes it may come with (spec §6, §12)
OUTCOMES: dict[str | None, set[str]] = {
    None: {"complete", "length"},
    "upstream_error": {"upstream_error", "canceled"},
    "upstream_rejected": {"upstream_error"},
    "upstream_protocol_error": {"protocol_error"},
    "upstream_timeout": {"incomplete"},
    "upstream_unavailable": {"incomplete", "upstream_error"},
    "upstream_not_ready": {"rejected"},
    "evidence_not_found": {"rejected"},
    "admission_timeout": {"rejected"},
    "queue_full": {"rejected"},
    "audit_unavailable": {"rejected"},
}
#: upload refusals the soak provokes (the inference half of the race is then skipped)
UPLOAD_REFUSALS = {"evidence_quota_exceeded", "queue_full", "audit_unavailable"}
KINDS = {
    "stream_ok": 26,
    "json_ok": 14,
    "completion_ok": 6,
    "fault": 18,
    "disc_body": 6,
    "disc_queued": 8,
    "disc_first": 6,
    "disc_mid": 8,
    "evidence": 8,
    "messages_ok": 10,
}


@dataclass
class Outcome:
    rid: str
    kind: str
    started: float
    alias: str = ""
    ended: float = 0.0
    status: int | None = None
    code: str | None = None  # caller-visible error code; None for a success
    disconnected: bool = False  # we hung up before the response ended
    done_seen: bool = False


@dataclass
class Soak:
    stack: Stack
    rng: random.Random
    token: str
    outcomes: list[Outcome] = field(default_factory=list)
    outages: list[tuple[float, float]] = field(default_factory=list)
    uploads: int = 0
    deletes: int = 0
    upload_refusals: Counter[str] = field(default_factory=Counter)
    audit_outages: list[tuple[float, float]] = field(default_factory=list)
    audit_fs: Path | None = None
    max_queue: float = 0.0
    max_active: int = 0
    serial: int = 0

    def next_rid(self, kind: str) -> str:
        self.serial += 1
        return f"soak-{self.serial:05d}-{kind}"


# ------------------------------------------------------------------ probes


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def upstream_sockets(port: int) -> int:
    """Open TCP sockets (established or close-wait) on either end of the worker port.

    The gateway's upstream pool keeps idle connections by design (and both
    ends live in this process); they are subtracted from the descriptor count.
    """
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, remote, state = parts[1], parts[2], parts[3]
            ports = {int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)}
            if port in ports and state in ("01", "08"):
                count += 1
    return count


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def gateway_tasks(stack: Stack) -> int:
    loop = stack.gw.server.server.servers[0].get_loop()

    async def count() -> int:
        return len(asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(count(), loop).result(5)


# ------------------------------------------------------------------ callers


def observe(out: Outcome, response: httpx.Response, stream: bool) -> None:
    out.status = response.status_code
    if response.status_code != 200:
        out.code = response.json()["error"]["code"]
        return
    if not stream:
        assert response.json()["object"] in ("chat.completion", "text_completion")
        return
    data = sse_data(response.text)
    out.done_seen = "[DONE]" in data
    if data and data[-1] == "[DONE]":
        assert data.count("[DONE]") == 1
        assert all("error" not in json.loads(d) for d in data[:-1])
        return
    assert not out.done_seen, "a failed stream never carries [DONE]"
    out.code = json.loads(data[-1])["error"]["code"]


async def plain(soak: Soak, client: httpx.AsyncClient, kind: str) -> Outcome:
    rng = soak.rng
    out = Outcome(soak.next_rid(kind), kind, time.monotonic())
    stream = rng.random() < 0.6 if kind != "stream_ok" else True
    path = "/v1/chat/completions"
    # Faults and successes on both upstreams and through the release.
    alias = out.alias = rng.choices(ALIASES, ALIAS_WEIGHTS)[0]
    if kind == "fault":
        fault = rng.choice(FAULTS)
        directive = fault if "=" in fault else f"fault={fault}"
        body = chat_body(f"go [[sim {directive} chunks=6]]", stream=stream, model=alias)
    elif kind == "completion_ok":
        path = "/v1/completions"
        chunks = rng.randint(1, 12)
        body = {"model": alias, "prompt": f"p [[sim chunks={chunks}]]", "stream": stream}
    else:
        chunks, delay = rng.randint(1, 24), rng.choice([0, 0, 1, 3])
        body = chat_body(f"hi [[sim chunks={chunks} delay_ms={delay}]]", stream=stream, model=alias)
        if kind == "json_ok":
            stream = body["stream"] = False
    response = await client.post(path, json=body, headers={"x-request-id": out.rid})
    observe(out, response, stream)
    out.ended = time.monotonic()
    return out


def observe_messages(out: Outcome, response: httpx.Response, stream: bool) -> None:
    """A Messages answer: the Anthropic message, or a stream the grammar accepts
    whole, or one that ends with one ``error`` event after a valid prefix."""
    out.status = response.status_code
    if response.status_code != 200:
        body = response.json()
        assert body["type"] == "error", body
        out.code = body["error"]["code"]
        return
    if not stream:
        assert response.json()["type"] == "message"
        return
    assert "[DONE]" not in response.text
    grammar = EventGrammar()
    events: list[tuple[str, Any]] = []
    for frame in response.text.split("\n\n"):
        lines = [line for line in frame.split("\n") if line]
        if not lines:
            continue
        name = next(line[7:] for line in lines if line.startswith("event: "))
        data = json.loads("".join(line[6:] for line in lines if line.startswith("data: ")))
        events.append((name, data))
    assert events, "a stream with no event"
    names = [name for name, _ in events]
    if names[-1] == "error":
        assert names.count("error") == 1 and "message_stop" not in names
        for name, data in events[:-1]:
            grammar.feed(name, data)  # a valid prefix
        out.code = events[-1][1]["error"]["code"]
        return
    for name, data in events:
        grammar.feed(name, data)
    grammar.end()


async def messages_call(soak: Soak, client: httpx.AsyncClient) -> Outcome:
    """``POST /v1/messages`` to any alias, the release's included; a credential
    as ``x-api-key`` (the Anthropic SDKs') or as Bearer."""
    rng = soak.rng
    out = Outcome(soak.next_rid("messages_ok"), "messages_ok", time.monotonic())
    out.alias = rng.choices(ALIASES, ALIAS_WEIGHTS)[0]
    stream = rng.random() < 0.6
    chunks, delay = rng.randint(1, 16), rng.choice([0, 0, 2])
    body = {
        "model": out.alias,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": f"hi [[sim chunks={chunks} delay_ms={delay}]]"}],
    }
    headers = {"x-request-id": out.rid, "anthropic-version": "2023-06-01"}
    request = client.build_request("POST", "/v1/messages", json=body, headers=headers)
    if rng.random() < 0.5:
        del request.headers["authorization"]
        request.headers["x-api-key"] = soak.token
    response = await client.send(request)
    observe_messages(out, response, stream)
    out.ended = time.monotonic()
    return out


async def evidence_race(soak: Soak, client: httpx.AsyncClient) -> Outcome | None:
    """Upload, then use the record while a delete (and its TTL) race the request."""
    rng = soak.rng
    out = Outcome(soak.next_rid("evidence"), "evidence", time.monotonic())
    uploaded = await client.post(
        "/v1/evidence",
        content=PNG,
        headers={
            "content-type": "image/png",
            "x-request-id": f"{out.rid}-upload",
            "x-evidence-locator": f"soak/{out.rid}",
        },
    )
    if uploaded.status_code != 201:
        code = uploaded.json()["error"]["code"]
        assert code in UPLOAD_REFUSALS, uploaded.text
        soak.upload_refusals[code] += 1
        return None
    soak.uploads += 1
    evidence_id = uploaded.json()["id"]
    stream = rng.random() < 0.5
    body = chat_body("x", stream=stream)
    body["messages"][0]["content"] = [
        {"type": "text", "text": f"look [[sim chunks={rng.randint(1, 10)} delay_ms=2]]"},
        {"type": "image_url", "image_url": {"url": f"evidence:{evidence_id}"}},
    ]

    async def delete_later() -> None:
        await asyncio.sleep(rng.uniform(0, 0.03))
        deleted = await client.delete(f"/v1/evidence/{evidence_id}")
        # 404: its TTL forgot it first.
        assert deleted.status_code in (204, 404), deleted.text
        soak.deletes += 1

    deleter = asyncio.create_task(delete_later())
    response = await client.post(
        "/v1/chat/completions", json=body, headers={"x-request-id": out.rid}
    )
    observe(out, response, stream)
    await deleter
    out.ended = time.monotonic()
    return out


async def quota_probe(soak: Soak, client: httpx.AsyncClient) -> None:
    """Upload distinct records until the tenant's quota refuses one, then delete them."""
    made: list[str] = []
    try:
        for n in range(40):
            uploaded = await client.post(
                "/v1/evidence",
                content=PNG,
                headers={"content-type": "image/png", "x-evidence-locator": f"quota/{n}"},
            )
            if uploaded.status_code == 201:
                made.append(uploaded.json()["id"])
                continue
            code = uploaded.json()["error"]["code"]
            assert code in UPLOAD_REFUSALS, uploaded.text
            soak.upload_refusals[code] += 1
            if code == "evidence_quota_exceeded":
                return
        raise AssertionError("the record quota never refused an upload")
    finally:
        for evidence_id in made:
            deleted = await client.delete(f"/v1/evidence/{evidence_id}")
            assert deleted.status_code in (204, 404), deleted.text


async def audit_outage(soak: Soak, at_s: float) -> None:
    """Fill the receipts' filesystem, hold it full a moment, free it; wait for recovery."""
    assert soak.audit_fs is not None
    await asyncio.sleep(at_s)
    runtime = soak.stack.runtime
    started = time.monotonic()
    await asyncio.to_thread(fill, soak.audit_fs)
    try:
        await asyncio.sleep(soak.rng.uniform(0.3, 0.6))
    finally:
        await asyncio.to_thread(free, soak.audit_fs)
    # the writer lives on the gateway's loop: polled, so that loop keeps running
    await eventually_async(lambda: runtime.receipts.healthy, "receipts resumed", 10)
    soak.audit_outages.append((started, time.monotonic()))


async def hang_up(soak: Soak, kind: str) -> Outcome:
    """A raw HTTP/1.1 caller that goes away at a chosen point."""
    rng = soak.rng
    out = Outcome(soak.next_rid(kind), kind, time.monotonic(), disconnected=True)
    directive = {
        "disc_body": "chunks=4",
        "disc_queued": "chunks=200 delay_ms=10",
        "disc_first": "first_delay_ms=1500 chunks=2",
        "disc_mid": "chunks=200 delay_ms=10",
    }[kind]
    # Only a stream shows bytes before its end; the others may be streams or not.
    stream = kind in ("disc_mid", "disc_first") or rng.random() < 0.7
    alias = SECOND_ALIAS if rng.random() < 0.4 else "gemma-4-mm"
    payload = json.dumps(chat_body(f"[[sim {directive}]]", stream=stream, model=alias)).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        f"authorization: Bearer {soak.token}\r\ncontent-type: application/json\r\n"
        f"x-request-id: {out.rid}\r\ncontent-length: {len(payload)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", soak.stack.gw.server.port)
    try:
        if kind == "disc_body":
            writer.write(head + payload[: len(payload) // 2])
            await writer.drain()
            await asyncio.sleep(rng.uniform(0, 0.05))
        elif kind == "disc_mid":
            writer.write(head + payload)
            await writer.drain()
            seen = b""
            async with asyncio.timeout(10):
                while b"data: {" not in seen and b'"error"' not in seen and len(seen) < 65_536:
                    piece = await reader.read(4096)
                    if not piece:
                        break
                    seen += piece
        else:
            writer.write(head + payload)
            await writer.drain()
            await asyncio.sleep(rng.uniform(0.0, 0.15))
    finally:
        if rng.random() < 0.5:
            writer.transport.abort()  # RST
        else:
            writer.close()  # FIN
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    out.ended = time.monotonic()
    return out


async def outage(soak: Soak, gate: asyncio.Semaphore, at_s: float) -> None:
    """Stop the worker (connection refused), then start a new one on the same port.

    The stop waits for a quiet moment (every caller slot held, so no request is
    mid-flight), so that every caller's expected outcome stays known; worker
    connections dying mid-stream are covered by the ``close_mid`` fault.
    """
    await asyncio.sleep(at_s)
    stack = soak.stack
    port = stack.sim.port
    async with asyncio.timeout(30):
        for _ in range(CONCURRENCY):
            await gate.acquire()
    started = time.monotonic()
    try:
        await asyncio.to_thread(stack.sim.stop)
    finally:
        for _ in range(CONCURRENCY):
            gate.release()
    await asyncio.sleep(soak.rng.uniform(0.2, 0.4))  # callers meet a refused port meanwhile
    sim = Simulator(port=port, model_id=SIM_ROUTE)
    await asyncio.to_thread(sim.start)
    stack.sim = sim
    # readiness lives on the gateway's loop: polled, so that loop keeps running
    await eventually_async(stack.runtime.accepting, "the restarted worker ready", 5)
    soak.outages.append((started, time.monotonic()))


async def sample_queue(soak: Soak, stop: asyncio.Event) -> None:
    while not stop.is_set():
        soak.max_queue = max(soak.max_queue, soak.stack.metric("gateway_admission_queue_depth"))
        soak.max_active = max(soak.max_active, soak.stack.sim.active_streams)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)


async def run_round(
    soak: Soak, count: int, *, with_outage: bool, with_audit_outage: bool = False
) -> list[Outcome]:
    gate = asyncio.Semaphore(CONCURRENCY)
    kinds = soak.rng.choices(list(KINDS), weights=list(KINDS.values()), k=count)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    headers = {"authorization": f"Bearer {soak.token}"}
    async with httpx.AsyncClient(
        base_url=soak.stack.url, headers=headers, limits=limits, timeout=30
    ) as client:

        async def one(kind: str) -> Outcome | None:
            async with gate:
                if kind.startswith("disc_"):
                    return await hang_up(soak, kind)
                if kind == "evidence":
                    return await evidence_race(soak, client)
                if kind == "messages_ok":
                    return await messages_call(soak, client)
                return await plain(soak, client, kind)

        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_queue(soak, stop))
        side = [asyncio.create_task(outage(soak, gate, 0.6))] if with_outage else []
        if with_audit_outage:
            side.append(asyncio.create_task(audit_outage(soak, 0.3)))
        else:
            side.append(asyncio.create_task(quota_probe(soak, client)))
        async with asyncio.timeout(120):
            results = await asyncio.gather(*(one(k) for k in kinds))
            await asyncio.gather(*side)
        stop.set()
        await sampler
    return [r for r in results if r is not None]


# ------------------------------------------------------------------ checks


def overlaps(out: Outcome, outages: list[tuple[float, float]]) -> bool:
    return any(out.started <= end and start <= out.ended for start, end in outages)


# Requests that should have succeeded; outside an outage, any failure of one
# is "collateral" damage from another request's fault and fails the soak.
# (It caught the upstream pool handing out a connection it had just closed.)
SHOULD_SUCCEED = {"stream_ok", "json_ok", "completion_ok", "messages_ok"}


def check_receipts(soak: Soak, outcomes: list[Outcome]) -> tuple[Counter[str], int, Counter[str]]:
    stack = soak.stack
    ids = {o.rid for o in outcomes}

    def all_written() -> bool:
        return ids <= {r["request_id"] for r in stack.receipts()}

    assert eventually(all_written, 10), "every inference request leaves a receipt"
    receipts: dict[str, list[dict[str, Any]]] = {}
    for receipt in stack.receipts():
        receipts.setdefault(receipt["request_id"], []).append(receipt)
    tally: Counter[str] = Counter()
    arms: Counter[str] = Counter()  # the release's receipts by the arm that answered
    collateral = 0
    for out in outcomes:
        [receipt] = receipts[out.rid]  # exactly one
        mark = receipt.get("release")
        if mark is not None:
            assert out.alias == RELEASE_ALIAS and mark["name"] == RELEASE, (out, receipt)
            assert mark["arm"] in ("stable", "canary"), receipt
            assert receipt["route"] == (SIM_ROUTE if mark["arm"] == "stable" else SECOND_ROUTE)
            arms[mark["arm"]] += 1
            if mark.get("fallback_from") is not None:
                arms["fallback"] += 1
        outcome, code = receipt["outcome"], receipt["error_code"]
        tally[outcome] += 1
        in_outage = overlaps(out, soak.outages) or overlaps(out, soak.audit_outages)
        if out.disconnected:
            allowed = {"canceled"}
            if in_outage:  # the outage may have ended it first
                allowed |= {"incomplete", "upstream_error", "rejected"}
            assert outcome in allowed, (code, out, receipt)
            continue
        assert outcome in OUTCOMES[out.code], (out, receipt)
        assert code == out.code, (out, receipt)
        if out.kind in SHOULD_SUCCEED and out.code is not None and not in_outage:
            collateral += 1
    assert set(receipts) == ids, "no receipt without a request"
    return tally, collateral, arms


@dataclass
class Levels:
    fds: int
    upstream: int
    tasks: int
    rss: float

    @property
    def own_fds(self) -> int:
        return self.fds - self.upstream


def levels(stack: Stack, second: Simulator) -> Levels:
    gc.collect()
    pooled = upstream_sockets(stack.sim.port) + upstream_sockets(second.port)
    return Levels(fd_count(), pooled, gateway_tasks(stack), rss_mb())


def settle(stack: Stack, second: Simulator, base: Levels, fd_slack: int, task_slack: int) -> Levels:
    """Levels once the stack is idle again (bounded wait)."""
    now = levels(stack, second)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        now.own_fds > base.own_fds + fd_slack or now.tasks > base.tasks + task_slack
    ):
        time.sleep(0.05)
        now = levels(stack, second)
    return now


def warm_up(soak: Soak) -> None:
    """Fill pools and caches so the baseline is a steady state, not a cold start."""
    soak.outcomes.extend(asyncio.run(run_round(soak, 2 * CONCURRENCY, with_outage=False)))


@pytest.fixture
def served_gc() -> Iterator[None]:
    """The collector tuned as `serve` tunes it, so the memory checks cover that setting."""
    thresholds = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.fixture
def second() -> Iterator[Simulator]:
    """The second upstream's worker (its own simulator, its own route)."""
    sim = Simulator(model_id=SECOND_ROUTE)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


def test_chaos_soak(tmp_path: Path, served_gc: None, second: Simulator) -> None:
    started = time.monotonic()
    more = [
        {
            **UPSTREAM,
            "name": "second",
            "base_url": second.base_url,
            "routes": [SECOND_ROUTE],
            "capacity": SECOND_CAPACITY,
        }
    ]
    with (
        small_fs(tmp_path / "audit", 16 * 1024) as audit_fs,
        running_stack(
            tmp_path,
            acme=ACME,
            upstream=UPSTREAM,
            more_upstreams=more,
            staging=STAGING,
            audit={"path": str(audit_fs / "receipts.jsonl")},
            admission={"capacity": CAPACITY, "max_queue": 4 * CONCURRENCY},
            releases=RELEASES,
        ) as stack,
    ):
        first_sim = stack.sim
        soak = Soak(stack, random.Random(SEED), stack.rs256(), audit_fs=audit_fs)
        try:
            warm_up(soak)
            base = levels(stack, second)
            rss_after_round: list[float] = []
            for number in range(ROUNDS):
                run = run_round(
                    soak, PER_ROUND, with_outage=number % 2 == 0, with_audit_outage=number == 1
                )
                results = asyncio.run(run)
                soak.outcomes.extend(results)
                check = settle(stack, second, base, fd_slack=6, task_slack=2)
                rss_after_round.append(check.rss)
            final = settle(stack, second, base, fd_slack=6, task_slack=2)
            tally, collateral, arms = check_receipts(soak, soak.outcomes)
            counted = {
                arm: stack.metric("gateway_release_requests_total", release=RELEASE, arm=arm)
                for arm in ("stable", "canary")
            }
            permits = stack.metric("gateway_permits_in_use")
            per_upstream = {
                name: stack.metric("gateway_permits_in_use", upstream=name)
                for name in ("default", "second")
            }
            second_requests = sum(1 for r in second.requests() if r.method == "POST")
            leases = stack.metric("gateway_evidence_leases_active")
            staged = sorted(p.name for p in (tmp_path / "var" / "evidence").glob("*.png"))
        finally:
            if stack.sim is not first_sim:
                stack.sim.stop()

    kinds = Counter(o.kind for o in soak.outcomes)
    total = len(soak.outcomes)
    disconnects = sum(kinds[k] for k in KINDS if k.startswith("disc_"))
    failed = [o for o in soak.outcomes if o.code is not None]
    growth = rss_after_round[-1] - rss_after_round[0]
    by_point = {k: kinds[k] for k in KINDS if k.startswith("disc_")}
    print(
        f"\nsoak ({'long' if LONG else 'short'}, seed {SEED}): {total} inference requests "
        f"in {ROUNDS} rounds, concurrency {CONCURRENCY}, capacity {CAPACITY}, "
        f"max queue depth {soak.max_queue:.0f}, max worker streams {soak.max_active}\n"
        f"  disconnect rate {disconnects / total:.1%} {by_point}\n"
        f"  worker fault rate {kinds['fault'] / total:.1%}, outages {len(soak.outages)}, "
        f"caller-visible failures {len(failed)} (collateral: {collateral})\n"
        f"  evidence uploads {soak.uploads}, deletes {soak.deletes}, "
        f"upload refusals {dict(soak.upload_refusals)}, audit outages {len(soak.audit_outages)}\n"
        f"  receipt outcomes {dict(tally)}\n"
        f"  permits {permits:.0f} {per_upstream}, second upstream: {second_requests} requests, "
        f"max {second.max_active_streams} streams\n"
        f"  release {RELEASE!r}: receipts by arm {dict(arms)}, counted {counted}, "
        f"messages requests {kinds['messages_ok']}\n"
        f"  leases {leases:.0f}, staged files left {len(staged)}\n"
        f"  fds {base.own_fds}->{final.own_fds} "
        f"(+{base.upstream}/{final.upstream} pooled upstream), "
        f"gateway tasks {base.tasks}->{final.tasks}, "
        f"RSS {base.rss:.1f}->{final.rss:.1f} MB (round-to-round {growth:+.1f} MB)\n"
        f"  wall time {time.monotonic() - started:.1f} s"
    )
    assert permits == 0
    assert per_upstream == {"default": 0, "second": 0}
    assert second_requests > 0, "the second upstream served its share"
    assert second.max_active_streams <= SECOND_CAPACITY
    assert leases == 0
    assert arms["stable"] and arms["canary"], "the release split its requests"
    # every receipt naming the release is counted; a fallen-back attempt once more
    assert sum(counted.values()) == arms["stable"] + arms["canary"] + arms["fallback"]
    assert kinds["messages_ok"] > 0
    assert staged == [], "a file whose records were all deleted is removed"
    assert final.own_fds <= base.own_fds + 6, "descriptors leaked"
    assert final.tasks <= base.tasks + 2, "gateway tasks leaked"
    assert final.rss <= base.rss + 64, "memory not back near baseline"
    assert growth <= 24, "memory grows round over round"
    assert collateral == 0, "one request's failure hurt another"
    assert soak.max_queue > 0, "requests did queue for admission"
    assert soak.outages and kinds["fault"] and disconnects
    assert soak.audit_outages, "receipts failed mid-soak and came back"
    assert soak.upload_refusals["evidence_quota_exceeded"], "uploads met the quota"
