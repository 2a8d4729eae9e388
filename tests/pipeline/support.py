"""Small fakes for the pipeline's unit tests: a worker stream without a socket,
a caller's ASGI ``send`` that records (and can stop reading), a chat plan."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from gateway.apis.base import Plan
from gateway.books.evidence.leases import RequestMedia
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.protocols import KeptResponse
from gateway.books.receipts import Receipt
from gateway.books.state.calls import StateCalls
from gateway.config import LimitsConfig
from gateway.config.policy import Modality, PolicyLimits, Tenant, TenantPolicy, resolve_limits
from gateway.core.errors import GatewayError
from gateway.observe.access import RequestInfo
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.call import Call
from gateway.pipeline.cancel import Exchange
from gateway.pipeline.relay import Opener
from gateway.pipeline.runtime import Runtime
from gateway.pipeline.timings import Timings
from gateway.types import Message
from gateway.upstream.client import UpstreamStream

SSE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "sse"
ALIAS = "gemma-4-mm"
ROUTE = "/srv/models/chat"
TENANT = "acme"
NONCE = "0123456789abcdef"
ALL_MODALITIES: list[Modality] = ["text", "image", "audio", "video"]


def sse_fixture(name: str) -> bytes:
    return (SSE_DIR / name).read_bytes()


class FakeUpstream:
    """What the relay reads from :class:`~gateway.upstream.client.UpstreamStream`:
    byte chunks as the worker sent them, ``closed`` once read to its end (or
    closed), a synchronous ``close()``. Pieces queued with :meth:`feed` are
    read in order; without :meth:`finish` (or ``end=True``) the next read waits
    forever, like a worker that went silent."""

    def __init__(self, pieces: Iterable[bytes] = (), *, end: bool = True) -> None:
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self.closed = False
        self.close_calls = 0
        self.reads = 0
        for piece in pieces:
            self.feed(piece)
        if end:
            self.finish()

    def feed(self, data: bytes) -> None:
        self._queue.put_nowait(data)

    def finish(self) -> None:
        self._queue.put_nowait(None)

    def fail(self, exc: BaseException) -> None:
        self._queue.put_nowait(exc)

    def __aiter__(self) -> FakeUpstream:
        return self

    async def __anext__(self) -> bytes:
        if self.closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self.closed = True  # as UpstreamStream: released at the body's end
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        self.reads += 1
        return item

    def close(self) -> None:
        self.close_calls += 1
        self.closed = True

    def opener(self) -> Opener:
        async def open_stream() -> UpstreamStream:
            return cast(UpstreamStream, self)

        return open_stream


class Caller:
    """An ASGI ``send`` that records every message; from message number
    ``stall_at`` on (0-based) it never returns, like a caller whose socket
    buffer is full."""

    def __init__(self, *, stall_at: int | None = None) -> None:
        self.messages: list[Message] = []
        self.stall_at = stall_at

    async def send(self, message: Message) -> None:
        self.messages.append(message)
        if self.stall_at is not None and len(self.messages) > self.stall_at:
            await asyncio.Event().wait()

    @property
    def starts(self) -> list[Message]:
        return [m for m in self.messages if m["type"] == "http.response.start"]

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m["type"] == "http.response.body"]

    @property
    def body(self) -> bytes:
        return b"".join(self.bodies)


def chat_plan(
    *,
    stream: bool = True,
    include_usage: bool = True,
    max_tokens: int = 64,
    prompt_bytes: int = 5,
    **body: Any,
) -> Plan:
    """A chat plan as ``gateway/pipeline/probe.py`` builds one."""
    return Plan(
        endpoint="chat.completions",
        alias=ALIAS,
        body={
            "model": ALIAS,
            "messages": [{"role": "user", "content": "hello"}],
            "stream": stream,
            **body,
        },
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        prompt_bytes=prompt_bytes,
        nonce=NONCE,
    )


def make_tenant(
    *,
    models: dict[str, str] | None = None,
    modalities: list[Modality] | None = None,
    max_media_bytes: int | None = None,
) -> Tenant:
    policy = TenantPolicy(
        tenant=TENANT,
        models={ALIAS: ROUTE} if models is None else models,
        modalities=ALL_MODALITIES if modalities is None else modalities,
        limits=PolicyLimits(max_media_bytes=max_media_bytes),
    )
    return Tenant(TENANT, policy, resolve_limits(policy.limits, LimitsConfig()))


def record(
    evidence_id: str,
    media_type: str = "image/png",
    size: int = 10,
    *,
    ext: str = "png",
    locator: str | None = None,
) -> EvidenceRecord:
    sha = (evidence_id.encode().hex() * 64)[:64]
    return EvidenceRecord(evidence_id, TENANT, sha, media_type, ext, size, locator, 1_755_870_000)


class FakeReceipts:
    def __init__(self) -> None:
        self.written: list[Receipt] = []
        #: request ids whose open line was queued (write-ahead, spec §24)
        self.opened: list[str] = []

    def write(self, receipt: Receipt) -> None:
        self.written.append(receipt)

    def open(self, receipt: Receipt) -> None:
        self.opened.append(receipt.request_id)
        receipt.open_seq = len(self.opened)


class FakeLimits:
    def __init__(self) -> None:
        self.settled: list[tuple[object, int]] = []

    def settle(self, hold: object, used_tokens: int) -> None:
        self.settled.append((hold, used_tokens))


class FakeResponses:
    """The response book as the pipeline uses it: rows kept in a list (or the
    error ``fail`` raised), conversations looked up in ``chains``."""

    def __init__(self) -> None:
        self.kept: list[KeptResponse] = []
        self.bounds: list[int] = []
        #: (tenant, response id) -> the conversation ending there, oldest first
        self.chains: dict[tuple[str, str], list[KeptResponse]] = {}
        self.fail: GatewayError | None = None

    def row(
        self,
        *,
        tenant: str,
        response_id: str,
        alias: str,
        previous_id: str | None,
        input_items: bytes,
        output_items: bytes,
        body: bytes | None,
        upstream_id: str | None,
    ) -> KeptResponse:
        return KeptResponse(
            tenant,
            response_id,
            alias,
            0.0,
            60,
            previous_id,
            input_items,
            output_items,
            body,
            upstream_id,
        )

    async def keep(self, row: KeptResponse, max_bytes: int) -> None:
        if self.fail is not None:
            raise self.fail
        self.kept.append(row)
        self.bounds.append(max_bytes)

    async def chain(self, tenant: str, response_id: str, max_links: int) -> list[KeptResponse]:
        return self.chains.get((tenant, response_id), [])[-max_links:]


class FakeRuntime:
    """The parts of a :class:`~gateway.pipeline.runtime.Runtime` that one
    request's steps and its ``finally`` touch; real metrics on their own registry."""

    def __init__(
        self,
        *,
        table: Any = None,
        readiness: Any = None,
        config: Any = None,
        ratelimit: Any = None,
        evidence: Any = None,
    ) -> None:
        self.inflight: set[Exchange] = set()
        self.metrics = GatewayMetrics()
        self.receipts = FakeReceipts()
        self.ratelimit = ratelimit if ratelimit is not None else FakeLimits()
        self.responses = FakeResponses()
        self.table = table
        self.readiness = readiness
        self.config = config
        self.evidence = evidence
        self.state = FakeState()


class FakeState:
    """The books' backend as the steps see it: only its health (``calls.degraded``)."""

    def __init__(self) -> None:
        self.calls = StateCalls(None)


class FakeMedia:
    """A request's evidence (``RequestMedia``): what was leased and staged, in order."""

    def __init__(
        self,
        records: Iterable[EvidenceRecord] = (),
        staged: dict[int, EvidenceRecord] | None = None,
    ) -> None:
        self._records = list(records)
        self._staged = staged or {}
        self.events: list[Any] = []

    async def lease(self, ids: list[str]) -> list[EvidenceRecord]:
        self.events.append(("lease", list(ids)))
        return [r for r in self._records if r.id in ids]

    async def stage(self, parts: list[Any], records: dict[int, EvidenceRecord]) -> None:
        """Fills ``records`` as each part is staged, as ``RequestMedia.stage`` does."""
        self.events.append(("stage", list(parts)))
        for slot, *_ in parts:
            if slot in self._staged:
                records[slot] = self._staged[slot]

    async def settle(self) -> None:
        self.events.append("settle")

    async def close(self) -> None:
        self.events.append("close")


def make_call(
    rt: FakeRuntime | None = None,
    *,
    media: FakeMedia | None = None,
    tenant: Tenant | None = None,
    send: Any = None,
    exchange: Exchange | None = None,
) -> Call:
    tenant = tenant or make_tenant()
    receipt = Receipt(
        request_id="req-1",
        tenant=tenant.name,
        subject="alice",
        endpoint="chat.completions",
        serve_identity=None,
    )
    started = time.monotonic()
    return Call(
        rt=cast(Runtime, rt or FakeRuntime()),
        info=RequestInfo(request_id="req-1", started=started, tenant=tenant.name),
        send=send or Caller().send,
        tenant=tenant,
        receipt=receipt,
        exchange=exchange or Exchange(),
        media=cast(RequestMedia, media or FakeMedia()),
        timings=Timings(started),
    )


async def run_steps(call: Call) -> None:
    """The planned call's steps, resolve then run, as the edge takes them (chat)."""
    from gateway.apis.chat.api import ChatApi
    from gateway.pipeline import steps

    assert call.plan is not None
    steps.resolve(call, call.plan)
    async with asyncio.timeout(5):
        await steps.run(call, ChatApi(), call.plan)
