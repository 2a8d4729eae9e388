"""Small fakes for the pipeline's unit tests: a worker stream without a socket,
a caller's ASGI ``send`` that records (and can stop reading), a chat plan."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.admission import AdmissionGroup
from gateway.apis.base import Plan
from gateway.books.evidence.encode import BodyProducer
from gateway.books.evidence.leases import Inline
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.evidence.store import EvidenceStore
from gateway.books.files.records import FileRecord, new_file_id
from gateway.books.files.sniff import sniff_file
from gateway.books.protocols import Decision, KeptResponse
from gateway.books.receipts import Receipt
from gateway.config import GatewayConfig, LimitsConfig, StagingConfig
from gateway.config.policy import Modality, PolicyLimits, Tenant, TenantPolicy, resolve_limits
from gateway.core.body import Layout
from gateway.core.errors import GatewayError
from gateway.core.signed_urls import LinkSigner
from gateway.observe.access import RequestInfo
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.call import Attempt, Call, Routed
from gateway.pipeline.cancel import Exchange
from gateway.pipeline.relay import Opener
from gateway.pipeline.services import Limits, Services
from gateway.pipeline.timings import Timings
from gateway.ratelimit.base import Hold
from gateway.ratelimit.core import TenantLimits
from gateway.types import Message
from gateway.upstream.base import Accept, Rejection, WorkerStream
from gateway.upstream.table import Resolved, RouteReadiness, RouteTable, Worker

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

    def __init__(
        self,
        pieces: Iterable[bytes] = (),
        *,
        end: bool = True,
        content_type: bytes = b"text/event-stream",
    ) -> None:
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self.content_type = content_type
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
        async def open_stream() -> WorkerStream:
            return self

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
    """Limits that only record settlements (tests that never reserve)."""

    def __init__(self) -> None:
        self.settled: list[tuple[Hold, int]] = []

    async def reserve(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold:
        raise AssertionError("these tests never reserve")

    def reserve_now(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold | None:
        raise AssertionError("these tests never reserve")

    def settle(self, hold: Hold, used_tokens: int) -> None:
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


def no_blobs() -> EvidenceStore:
    """An evidence store never read: these tests' bodies carry no staged media."""
    return EvidenceStore(Path("/nonexistent/evidence"))


def make_services(
    *,
    table: RouteTable | None = None,
    readiness: RouteReadiness | None = None,
    config: GatewayConfig | None = None,
    limits: Limits | None = None,
) -> Services:
    """The services one request's steps and its ``finally`` touch: fake books,
    real metrics on their own registry, an empty route table unless given."""
    return Services(
        table=table or RouteTable([], AdmissionGroup({}, 8)),
        readiness=readiness or AllReady(),
        limits=limits if limits is not None else FakeLimits(),
        responses=FakeResponses(),
        receipts=FakeReceipts(),
        metrics=GatewayMetrics(),
        staging=config.staging if config is not None else StagingConfig(),
        blobs=no_blobs(),
        image_files=FakeImageFiles(),
        links=LinkSigner("https://gw.test", LINK_KEY, 3600),
        files=FakeFiles(),
        approvals=FakeApprovals(),
    )


#: the link key of the fake services (32 bytes)
LINK_KEY = b"k" * 32


@dataclass(frozen=True)
class FakeFile:
    id: str
    tenant: str
    data: bytes
    name: str
    mime_type: str = "image/png"

    @property
    def bytes(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class FakeImageFiles:
    """The url images' files in memory: what was stored, in order."""

    def __init__(self) -> None:
        self.stored: list[FakeFile] = []

    async def put(self, tenant: str, data: bytes | Iterable[bytes], name: str) -> FakeFile:
        whole = data if isinstance(data, bytes) else b"".join(data)
        stored = FakeFile(f"file_fake{len(self.stored):08d}", tenant, whole, name)
        self.stored.append(stored)
        return stored


class FakeFiles:
    """The file book as the pipeline uses it: records (and their bytes) kept in
    a list, the type sniffed as the real book does; ``fail`` is raised instead."""

    def __init__(self) -> None:
        self.kept: list[tuple[FileRecord, bytes]] = []
        self.fail: GatewayError | None = None

    async def put(self, tenant: str, data: bytes, name: str) -> FileRecord:
        if self.fail is not None:
            raise self.fail
        kind = sniff_file(data)
        digest = hashlib.sha256(data).hexdigest()
        record = FileRecord(new_file_id(), tenant, name, digest, kind.mime, kind.ext, len(data), 0)
        self.kept.append((record, data))
        return record


class FakeApprovals:
    """Caller approvals as a stream uses them: ``decisions`` answers each wait
    (absent: the wait times out, None), every call noted in ``events``."""

    def __init__(self, decisions: dict[str, Decision] | None = None) -> None:
        self.decisions: dict[str, Decision] = dict(decisions or {})
        self.events: list[tuple[str, str]] = []

    async def open(self, tenant: str, request_id: str, approval_id: str) -> None:
        self.events.append(("open", approval_id))

    async def wait(self, approval_id: str, timeout_s: float) -> Decision | None:
        self.events.append(("wait", approval_id))
        return self.decisions.get(approval_id)

    async def close(self, approval_id: str) -> None:
        self.events.append(("close", approval_id))


class AllReady:
    def ready(self, route: str) -> bool:
        return True


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

    async def lease(self, ids: Sequence[str]) -> list[EvidenceRecord]:
        self.events.append(("lease", list(ids)))
        return [r for r in self._records if r.id in ids]

    async def stage(self, parts: Sequence[Inline], records: dict[int, EvidenceRecord]) -> None:
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
    services: Services | None = None,
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
        services=services or make_services(),
        info=RequestInfo(request_id="req-1", started=started, tenant=tenant.name),
        send=send or Caller().send,
        tenant=tenant,
        receipt=receipt,
        exchange=exchange or Exchange(),
        media=media or FakeMedia(),
        timings=Timings(started),
    )


async def run_steps(call: Call) -> None:
    """The planned call's steps, resolve then run, as the edge takes them (chat)."""
    from gateway.apis.chat.api import ChatApi
    from gateway.pipeline import steps

    assert call.plan is not None
    routed = steps.resolve(call, call.plan, ChatApi.endpoint)
    async with asyncio.timeout(5):
        await steps.run(call, routed, ChatApi(), call.plan)


class FakeTransport:
    """A worker transport (:class:`~gateway.upstream.base.WorkerTransport`) for
    tests: subclasses answer :meth:`open_stream`; the small exchanges are never
    asked of it on a request's path."""

    async def open_stream(
        self,
        path: str,
        body: bytes | AsyncIterator[bytes],
        request_id: str,
        *,
        size: int | None = None,
        accept: Accept = "sse",
        traceparent: bytes | None = None,
        rejection: Rejection = "classified",
    ) -> WorkerStream:
        raise NotImplementedError

    async def get_models(self, timeout_s: float) -> Any:
        raise AssertionError("not on a request's path")

    async def request_json(
        self, method: str, path: str, request_id: str, timeout_s: float
    ) -> tuple[int, Any]:
        raise AssertionError("not on a request's path")

    async def post_json(
        self, path: str, body: Any, request_id: str, timeout_s: float
    ) -> tuple[int, Any]:
        raise AssertionError("no approval on this request's path")

    async def get_metrics(self, path: str, timeout_s: float, limit: int) -> tuple[int, bytes]:
        raise AssertionError("not on a request's path")

    async def aclose(self) -> None:
        pass


async def read_body(body: bytes | AsyncIterator[bytes]) -> bytes:
    """A forwarded body, whole or in pieces, as the worker would read it."""
    if isinstance(body, bytes):
        return body
    return b"".join([piece async for piece in body])


# -- the stages of a call, built from real parts ------------------------------


def make_worker(name: str = "default", route: str = ROUTE, capacity: int = 4) -> Worker:
    """A worker on a fake transport with a real admission pool."""
    config = GatewayConfig.model_validate(
        {
            "upstreams": [
                {"name": name, "base_url": "http://127.0.0.1:9", "routes": [route], **{}},
            ]
        }
    ).workers[0]
    admission = AdmissionGroup({name: capacity}, 8)[name]
    return Worker(config=config, client=FakeTransport(), admission=admission, serve_identity=None)


def route_call(call: Call, worker: Worker | None = None) -> Routed:
    """``call`` resolved to ``worker`` (a fresh one unless given), as
    ``steps.resolve`` leaves it."""
    worker = worker or make_worker()
    routed = call.routed = Routed(Resolved(ALIAS, ROUTE, worker, True))
    return routed


def routed_of(call: Call) -> Routed:
    assert call.routed is not None
    return call.routed


def attempt_of(call: Call) -> Attempt:
    assert call.attempt is not None
    return call.attempt


def sent_body(body: bytes = b'{"model":"x"}', *, complete: bool = True) -> BodyProducer:
    """A forwarded body without media, sent whole (or not at all)."""
    producer = BodyProducer(Layout((body,), len(body)), no_blobs())
    if complete:
        producer.sent = len(body)
        producer.hasher.update(body)
    return producer


def hold(tenant: str = TENANT) -> Hold:
    return Hold(tenant, TenantLimits(None, None, None, None))


def receipts_of(services: Services) -> FakeReceipts:
    assert isinstance(services.receipts, FakeReceipts)
    return services.receipts


def limits_of(services: Services) -> FakeLimits:
    assert isinstance(services.limits, FakeLimits)
    return services.limits


def responses_of(services: Services) -> FakeResponses:
    assert isinstance(services.responses, FakeResponses)
    return services.responses
