"""Property: replicas sharing one PostgreSQL and one staging volume keep the
evidence rules under any interleaving of their operations (spec §13, §17).

Two EvidenceService instances ("replicas", ``shared=True``, each with its own
pool and its own store object on ONE directory, so only the directory's
flock keeps them apart) run a drawn sequence of uploads (bytes from a small
pool, so digests collide across tenants and locators), leases, releases,
deletes, clock moves (past the TTL of one tenant, past the lease expiry),
expiry sweeps, lease sweeps and restarts; some steps run two operations at
once. A reference model predicts every answer; a concurrent pair must match
one of its two serial orders. After every step:

- no record lost: the live ids through each replica, and the rows in the
  store, are the model's;
- quotas exact: the capped tenant never holds more than its 3 records, and an
  upload past the quota is refused ``evidence_quota_exceeded``;
- no file removed while a record or an unexpired lease names its digest, and
  each such file reads back as the bytes uploaded;
- no file kept that nothing names, but for leases expired and not yet swept;
  after a sweep (or a restart's recovery) the files are exactly what is named.

Each example gets a database of its own on the session's server and a fresh
staging directory; the clock is the test's, shared by the replicas.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.books.evidence.records import EvidenceRecord
from gateway.books.evidence.service import EvidenceService, locator_digest
from gateway.books.evidence.store import TEMP_PREFIX, EvidenceStore
from gateway.config.policy import EvidencePolicy, Tenant
from gateway.core.errors import GatewayError
from tests.books.evidence.support import FakeClock, fixture_bytes, make_tenant
from tests.books.state.support import pg_catalog
from tests.fuzz.budget import budget
from tests.support.postgres import PostgresServer, database_name

PNG = fixture_bytes("tiny.png")
#: the sniffer reads the head only: another digest of the same type
PNG_TOO = PNG + b"\0"
BLOBS = (PNG, PNG_TOO, fixture_bytes("tiny.wav"), fixture_bytes("tiny.mp4"))
EXT = {
    hashlib.sha256(b).hexdigest(): ext
    for b, ext in zip(BLOBS, ("png", "png", "wav", "mp4"), strict=True)
}
LOCATORS = (None, "scan-1", "scan-2")
LEASE_TTL_S = 100.0
#: capped by records (3) and by bytes (two copies of the WAV pass 1,500)
CAPPED = make_tenant("acme", evidence=EvidencePolicy(max_records=3, max_bytes=1500))
#: records past 50 s are invisible until the expiry sweep forgets them
BRIEF = make_tenant("globex", evidence=EvidencePolicy(ttl_s=50))
TENANTS = (CAPPED, BRIEF)
REQUESTS = ("req-0", "req-1", "req-2")
REPLICAS = 2
UNKNOWN_ID = "ev_" + "a" * 26

Op = tuple[Any, ...]
#: ("ok", value) or ("error", code)
Outcome = tuple[str, Any]

replica = st.integers(0, REPLICAS - 1)
tenant = st.integers(0, len(TENANTS) - 1)
#: an index into the tenant's ids made so far (modulo their count); from
#: FOREIGN_REF on, into everyone's
ref = st.integers(0, 40)
FOREIGN_REF = 36
#: uploads lean to the capped tenant, so its quota is reached often
upload_op = st.tuples(
    st.just("upload"),
    replica,
    st.sampled_from((0, 0, 1)),
    st.integers(0, len(BLOBS) - 1),
    st.integers(0, 2),
)
lease_op = st.tuples(
    st.just("lease"),
    replica,
    st.integers(0, len(REQUESTS) - 1),
    tenant,
    st.lists(ref, min_size=1, max_size=2).map(tuple),
)
release_op = st.tuples(st.just("release"), replica, st.integers(0, len(REQUESTS) - 1))
delete_op = st.tuples(st.just("delete"), replica, tenant, ref)
advance_op = st.tuples(st.just("advance"), st.sampled_from((1.0, 20.0, 51.0, LEASE_TTL_S + 1)))
expire_op = st.tuples(st.just("expire"), replica, tenant)
sweep_op = st.tuples(st.just("sweep"), replica)
restart_op = st.tuples(st.just("restart"), replica)
single_op = st.one_of(
    upload_op,
    upload_op,
    upload_op,
    lease_op,
    lease_op,
    release_op,
    delete_op,
    advance_op,
    expire_op,
    sweep_op,
)
together = st.one_of(upload_op, upload_op, lease_op, release_op, delete_op, sweep_op)
pair_op = st.tuples(st.just("pair"), together, together)
ops_strategy = st.lists(
    st.one_of(single_op, single_op, single_op, pair_op, restart_op), min_size=12, max_size=40
)


class Mismatch(Exception):
    """The system answered other than the model predicts."""


@dataclass
class Kept:
    record: EvidenceRecord
    blob: bytes
    #: deleted or expired (the row is gone)
    gone: bool = False


@dataclass
class Model:
    now: float
    kept: list[Kept] = field(default_factory=list)
    #: request -> evidence id -> (sha256, expires)
    leases: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)

    def resolve(self, who: int, index: int) -> str:
        """Mostly one of the tenant's own ids (live or gone), now and then anyone's."""
        own = [k for k in self.kept if k.record.tenant == TENANTS[who].name]
        pool = self.kept if index >= FOREIGN_REF or not own else own
        return pool[index % len(pool)].record.id if pool else UNKNOWN_ID

    def not_before(self, who: Tenant) -> int:
        ttl = who.policy.evidence.ttl_s
        return int(self.now - ttl) if ttl else 0

    def visible(self, who: Tenant) -> list[Kept]:
        cutoff = self.not_before(who)
        return [
            k
            for k in self.kept
            if not k.gone and k.record.tenant == who.name and k.record.created >= cutoff
        ]

    def rows(self) -> list[Kept]:
        return [k for k in self.kept if not k.gone]

    def lease_rows(self) -> set[tuple[str, str, float]]:
        return {
            (req, eid, exp) for req, held in self.leases.items() for eid, (_, exp) in held.items()
        }

    def referenced(self) -> set[str]:
        held = {sha for h in self.leases.values() for sha, exp in h.values() if exp > self.now}
        return {k.record.sha256 for k in self.rows()} | held

    def stale(self) -> set[str]:
        return {sha for h in self.leases.values() for sha, exp in h.values() if exp <= self.now}

    def drop_expired_leases(self) -> int:
        """What a sweep does; how many distinct files the dropped leases held."""
        dropped: set[str] = set()
        for request in list(self.leases):
            held = self.leases[request]
            for eid, (sha, exp) in list(held.items()):
                if exp <= self.now:
                    dropped.add(sha)
                    del held[eid]
            if not held:
                del self.leases[request]
        return len(dropped)

    def apply(self, op: Op, outcome: Outcome) -> None:
        """Check ``outcome`` against the prediction for ``op`` and take it in."""
        kind = op[0]
        if kind == "upload":
            self._upload(TENANTS[op[2]], BLOBS[op[3]], LOCATORS[op[4]], outcome)
        elif kind == "lease":
            self._lease(op[2], TENANTS[op[3]], op[4], outcome)
        elif kind == "release":
            expect(outcome, ("ok", None))
            self.leases.pop(REQUESTS[op[2]], None)
        elif kind == "delete":
            who, evidence_id = TENANTS[op[2]], op[3]
            found = [k for k in self.rows() if k.record.id == evidence_id]
            if found and found[0].record.tenant == who.name:
                expect(outcome, ("ok", found[0].record))
                found[0].gone = True
            else:
                expect(outcome, ("error", "evidence_not_found"))
        elif kind == "expire":
            who = TENANTS[op[2]]
            cutoff = self.not_before(who)
            victims = [
                k
                for k in self.rows()
                if who.policy.evidence.ttl_s
                and k.record.tenant == who.name
                and k.record.created < cutoff
            ]
            expect(outcome, ("ok", len(victims)))
            for k in victims:
                k.gone = True
        elif kind == "sweep":
            expect(outcome, ("ok", self.drop_expired_leases()))
        elif kind == "restart":
            expect(outcome, ("ok", None))
            self.drop_expired_leases()  # recovery drops the expired leases
        else:
            raise AssertionError(f"unknown op {op!r}")

    def _upload(self, who: Tenant, blob: bytes, locator: str | None, outcome: Outcome) -> None:
        sha, locator_sha = hashlib.sha256(blob).hexdigest(), locator_digest(locator)
        live = self.visible(who)
        same = [
            k for k in live if k.record.sha256 == sha and k.record.locator_sha256 == locator_sha
        ]
        policy = who.policy.evidence
        if same:
            expect(outcome, ("ok", same[0].record))  # the oldest: find_same
        elif (
            len(live) + 1 > policy.max_records
            or sum(k.record.bytes for k in live) + len(blob) > policy.max_bytes
        ):
            expect(outcome, ("error", "evidence_quota_exceeded"))
        else:
            if outcome[0] != "ok":
                raise Mismatch(f"upload refused {outcome!r}; the model expected a new record")
            record: EvidenceRecord = outcome[1]
            wanted = (who.name, sha, EXT[sha], len(blob), locator_sha, int(self.now))
            got = (
                record.tenant,
                record.sha256,
                record.ext,
                record.bytes,
                record.locator_sha256,
                record.created,
            )
            if got != wanted or any(k.record.id == record.id for k in self.kept):
                raise Mismatch(f"new record {record!r}; the model expected {wanted!r}")
            self.kept.append(Kept(record, blob))

    def _lease(self, request: int, who: Tenant, ids: tuple[str, ...], outcome: Outcome) -> None:
        by_id = {k.record.id: k for k in self.visible(who)}
        if not all(i in by_id for i in ids):
            expect(outcome, ("error", "evidence_not_found"))
            return
        expect(outcome, ("ok", [by_id[i].record for i in ids]))
        held = self.leases.setdefault(REQUESTS[request], {})
        for i in ids:  # taken again: held from now (the PostgreSQL catalog's rule)
            held[i] = (by_id[i].record.sha256, self.now + LEASE_TTL_S)


def expect(outcome: Outcome, predicted: Outcome) -> None:
    if outcome != predicted:
        raise Mismatch(f"got {outcome!r}; the model predicted {predicted!r}")


class Fleet:
    """The replicas, their clock, the shared directory and a direct look at the store."""

    def __init__(self, dsn: str, staging: Path, clock: FakeClock) -> None:
        self.dsn, self.staging, self.clock = dsn, staging, clock
        self.restarts = 0
        self.replicas = [self.replica(n) for n in range(REPLICAS)]
        self.conn: asyncpg.Connection[asyncpg.Record] | None = None

    def replica(self, n: int) -> EvidenceService:
        """Replica ``n`` (its own pool, its own store object on the shared directory)."""
        catalog = pg_catalog(self.dsn, self.clock, f"replica-{n}-run-{self.restarts}")
        return EvidenceService(
            EvidenceStore(self.staging),
            catalog,
            lease_ttl_s=LEASE_TTL_S,
            shared=True,
            clock=self.clock,
        )

    async def restart(self, n: int) -> None:
        await self.replicas[n].close()
        self.restarts += 1
        self.replicas[n] = self.replica(n)
        await self.replicas[n].recover()

    async def execute(self, op: Op) -> Outcome:
        kind, svc = op[0], self.replicas[op[1]] if len(op) > 1 else None
        try:
            if kind == "upload":
                assert svc is not None
                record = await svc.upload(TENANTS[op[2]], BLOBS[op[3]], None, LOCATORS[op[4]])
                return ("ok", record)
            if kind == "lease":
                assert svc is not None
                return ("ok", await svc.lease(REQUESTS[op[2]], TENANTS[op[3]], list(op[4])))
            if kind == "release":
                assert svc is not None
                await svc.release(REQUESTS[op[2]])
                return ("ok", None)
            if kind == "delete":
                assert svc is not None
                return ("ok", await svc.delete(TENANTS[op[2]], op[3]))
            if kind == "expire":
                assert svc is not None
                return ("ok", await svc.expire(TENANTS[op[2]]))
            if kind == "sweep":
                assert svc is not None
                return ("ok", await svc.sweep())
            if kind == "restart":
                await self.restart(op[1])
                return ("ok", None)
        except GatewayError as exc:
            return ("error", exc.code)
        raise AssertionError(f"unknown op {op!r}")

    async def check(self, model: Model) -> None:
        """The invariants of the module docstring, against the real state."""
        store = self.replicas[0].store
        for who in TENANTS:
            wanted = {k.record.id for k in model.visible(who)}
            for n, svc in enumerate(self.replicas):
                page, more = await svc.page(who, 1000, None)
                assert not more
                assert {r.id for r in page} == wanted, f"{who.name}'s live ids via replica {n}"
            assert await self.replicas[1].usage(who) == (
                len(wanted),
                sum(k.record.bytes for k in model.visible(who)),
            )
        assert len(model.visible(CAPPED)) <= CAPPED.policy.evidence.max_records
        assert self.conn is not None
        rows = await self.conn.fetch("SELECT id FROM evidence_records")
        assert {r["id"] for r in rows} == {k.record.id for k in model.rows()}, "records"
        leases = await self.conn.fetch(
            "SELECT request_id, evidence_id, expires FROM evidence_leases"
        )
        assert {(r["request_id"], r["evidence_id"], r["expires"]) for r in leases} == (
            model.lease_rows()
        ), "leases"
        files = {sha for sha, _ in store.files()}
        referenced = model.referenced()
        assert referenced <= files, f"removed while named: {sorted(referenced - files)}"
        assert files <= referenced | model.stale(), f"kept, named by nothing: {files - referenced}"
        blob_of = {hashlib.sha256(b).hexdigest(): b for b in BLOBS}
        for sha in referenced:
            assert store.read(sha, EXT[sha]) == blob_of[sha]
        assert not [p for p in self.staging.iterdir() if p.name.startswith(TEMP_PREFIX)]

    async def close(self) -> None:
        for svc in self.replicas:
            await svc.close()
        if self.conn is not None:
            await self.conn.close()


def concrete(op: Op, model: Model) -> Op:
    """Name ids: a drawn index becomes one of the ids the example made."""
    if op[0] == "lease":
        return (*op[:4], tuple(model.resolve(op[3], i) for i in op[4]))
    if op[0] == "delete":
        return (*op[:3], model.resolve(op[2], op[3]))
    return op


async def step(fleet: Fleet, model: Model, op: Op) -> Model:
    if op[0] == "advance":
        fleet.clock.advance(op[1])
        model.now = fleet.clock.now
        await fleet.check(model)
        return model
    if op[0] != "pair":
        op = concrete(op, model)
        outcome = await fleet.execute(op)
        try:
            model.apply(op, outcome)
        except Mismatch as exc:
            raise AssertionError(f"{op!r}: {exc}") from None
        await fleet.check(model)
        return model
    first, second = concrete(op[1], model), concrete(op[2], model)
    async with asyncio.timeout(60):
        outcomes = await asyncio.gather(fleet.execute(first), fleet.execute(second))
    # Serializable: the answers and the state after are those of one serial order.
    failures: list[str] = []
    for order in ((0, 1), (1, 0)):
        candidate = copy.deepcopy(model)
        try:
            for i in order:
                candidate.apply((first, second)[i], outcomes[i])
            await fleet.check(candidate)
        except (Mismatch, AssertionError) as exc:
            failures.append(f"order {order}: {exc}")
            continue
        return candidate
    raise AssertionError(f"{first!r} | {second!r} match no serial order: {failures}")


async def run(server: PostgresServer, ops: list[Op]) -> None:
    name = database_name("fleet")
    dsn = server.new_database(name)
    staging = Path(tempfile.mkdtemp(prefix="gw-fleet-"))
    clock = FakeClock()
    fleet = Fleet(dsn, staging, clock)
    try:
        fleet.conn = await asyncpg.connect(dsn, timeout=10)
        for svc in fleet.replicas:
            await svc.recover()  # each replica's start; the first migrates the schema
        model = Model(now=clock.now)
        for op in ops:
            model = await step(fleet, model, op)
        # Eventually: every lease past its expiry and swept, every record deleted,
        # and the volume holds nothing.
        model = await step(fleet, model, ("advance", LEASE_TTL_S + 1))
        model = await step(fleet, model, ("sweep", 0))
        assert {sha for sha, _ in fleet.replicas[0].store.files()} == {
            k.record.sha256 for k in model.rows()
        }
        for k in list(model.rows()):
            who = next(i for i, t in enumerate(TENANTS) if t.name == k.record.tenant)
            op = ("delete", 1, who, k.record.id)
            model.apply(op, await fleet.execute(op))
        await fleet.check(model)
        assert model.rows() == []
        assert fleet.replicas[0].store.files() == []
    finally:
        await fleet.close()
        shutil.rmtree(staging, ignore_errors=True)
        server.drop_database(name)


@pytest.mark.fuzz
@budget(25)
@given(ops=ops_strategy)
def test_replicas_never_lose_a_record_or_remove_a_named_file(
    shared_postgres: PostgresServer, ops: list[Op]
) -> None:
    asyncio.run(asyncio.wait_for(run(shared_postgres, ops), 300))
