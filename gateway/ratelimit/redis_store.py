"""The shared limits store (``limits_store.backend: redis``, spec §15).

Theory of operation
-------------------

Every replica of the gateway points at one Redis. Each decision is one Lua
script run by the server (``gateway.ratelimit.scripts``), registered with
``register_script``: the check and the take happen in one round trip, in
one atomic step, on the server's clock, so N replicas admit exactly what one
would. Nothing is read by a replica and then written back.

Keys are ``<key_prefix>{<tenant as UTF-8 hex>}:<kind>``, injective in the
tenant's name (``keys``). Every key written has a TTL (``scripts``).

**Reserve.** One ``reserve`` script call per request, within ``timeout_s``
(the connect timeout and, around the whole call, ``asyncio.timeout``; no
socket timeout, see ``from_url``); redis-py's own retries are off. A store that is
unreachable, refuses the script, or is slower than the timeout is a
*failure*, and so is a Redis over ``maxmemory``: every script is refused
whole, before any write, with ``OOM`` (``scripts``), for every tenant alike,
so ``healthy`` and ``/readyz`` stay down until memory is given back.
``on_error: closed`` raises 503 ``limits_unavailable``;
``on_error: open`` serves the request with an unchecked :class:`Hold` (no
headers, nothing to settle). Every failure is counted
(``gateway_limits_store_errors_total{op}``); the first of an episode is
logged with its reason (exception type and Redis' text, never the
password), and the first success after it logs the recovery. ``healthy`` is
False during an episode. There is no circuit breaker: each request tries
again, so the store recovers by itself as soon as Redis answers.

**Readiness** (spec §24) is not ``healthy``: one slow answer is that
request's failure, and every replica on one Redis sees the same slow
moment, so turning unready on it pulled a whole fleet out of its Service at
once. ``ready`` is False only once every call (requests, settlements,
renewals, probes) has failed for ``unready_after_s``, and True again at the
first success.

A reservation whose answer was lost (timeout, cancellation) may still have
been applied by the server, or may still be on its way there (the command
sits in a socket buffer while the server is paused). It is *voided* through
the settlement queue: a settle with no token refund, on another connection.
If the void finds the reservation's slot, the slot is freed and its tokens
stay charged (the conservative direction); if it finds nothing, it leaves a
tombstone for the lease, and a reservation arriving after its void takes
nothing at all (``scripts``). Either order frees the slot.

**Settle** is synchronous and never waits: it queues a settlement on a
:class:`~gateway.ratelimit.flusher.Flusher` whose one task pipelines
``settle`` script calls (one per hold) and retries with backoff while Redis
is failing. Settlements are idempotent on the server (a hold's entry in the
``holds`` set is removed by the one settlement that applies its refunds),
so a batch retried after a lost reply is not applied twice.

**Slot leases.** A slot expires ``lease_ttl_s`` after its reservation or
last renewal. ``reserve`` adds it to a :class:`~gateway.ratelimit.leases.SlotLeases`,
``settle`` discards it; every ``lease_renew_s`` one pipeline of ``renew``
scripts (one per tenant: a script's keys share a cluster slot) renews all
of them, under the lock settlements are applied under. A failed renewal is a
store failure (op ``renew``); the next interval tries again, and adds back
(and logs) the slots that expired meanwhile: their requests still run.

**After an outage** (spec §24), a slot may have expired on the server while
its request ran on (a stall longer than ``lease_ttl_s``), and another
replica's reservation could take it. So after any failure, the first call
that gets through renews every held slot first: a reservation waits for
that renewal before its own script (``_catch_up``, once for all who wait), a
probe does it before it reports the store healthy, and a settlement's or a
renewal's success starts it at once. The fleet then runs over
``max_concurrent_requests`` by at most what other replicas admitted in the
moment before this one saw Redis answer, not until the next
``lease_renew_s``.

**Crashes.** A replica that dies without settling stops renewing: its
slots are free within ``lease_ttl_s``, whatever ``total_timeout_s`` is. Its
holds expire with their lease (``lease_s``, the gateway passes
``upstream.total_timeout_s + 10``) and the tokens they reserved stay
charged: nothing refunds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, OutOfMemoryError, RedisError, ResponseError

from gateway.core.errors import GatewayError
from gateway.ratelimit.base import Hold, NullMetrics, StoreMetrics
from gateway.ratelimit.core import TenantLimits, Verdict, charges, judge
from gateway.ratelimit.flusher import Flusher
from gateway.ratelimit.keys import TenantKeys, tenant_keys
from gateway.ratelimit.leases import SlotLeases
from gateway.ratelimit.scripts import PROBE, RENEW, RESERVE, SETTLE

__all__ = ["RedisLimitsStore", "TenantKeys", "tenant_keys"]

log = logging.getLogger("gateway.limits")

OnError = Literal["closed", "open"]
#: the failures that make a store call fail (rather than a gateway bug)
_STORE_ERRORS = (RedisError, OSError, TimeoutError)
#: a batch (settlements, renewals) gets one timeout per this many scripts
_SCRIPTS_PER_TIMEOUT = 64


#: how long the settlement flusher waits, woken from idle, for more to share its write
_SETTLE_LINGER_S = 0.005


@dataclass(frozen=True, slots=True)
class _Settlement:
    keys: TenantKeys
    hold: str
    tpm: int
    minute_refund: int
    day: int
    day_refund: int
    #: the void of a reservation whose reply was lost (see the module docstring)
    void: bool = False


def _float(raw: Any) -> float | None:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return float(text) if text else None


class RedisLimitsStore:
    """Limits shared by every replica on one Redis; see the module docstring."""

    def __init__(
        self,
        client: Redis,
        *,
        key_prefix: str = "mrgw:",
        timeout_s: float = 0.05,
        on_error: OnError = "closed",
        lease_s: float = 610.0,
        lease_ttl_s: float = 15.0,
        lease_renew_s: float = 5.0,
        metrics: StoreMetrics | None = None,
        max_pending: int = 100_000,
        secret: str | None = None,
        probe_interval_s: float | None = None,
        unready_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_s <= 0 or lease_s <= 0:
            raise ValueError("timeout_s and lease_s must be positive")
        if not 0 < lease_renew_s < lease_ttl_s:
            raise ValueError("lease_renew_s must be positive and less than lease_ttl_s")
        if probe_interval_s is not None and probe_interval_s <= 0:
            raise ValueError("probe_interval_s must be positive")
        tenant_keys(key_prefix, "")  # validates the prefix
        self._client = client
        self._prefix = key_prefix
        self._timeout_s = timeout_s
        self._on_error: OnError = on_error
        self._lease_s = lease_s
        self._lease_ms = max(1, round(lease_s * 1000))
        self._slot_lease_ms = max(1, round(lease_ttl_s * 1000))
        self._metrics: StoreMetrics = metrics or NullMetrics()
        self._secret = secret
        self._keys: dict[str, TenantKeys] = {}
        self._reserve = client.register_script(RESERVE)
        self._settle = client.register_script(SETTLE)
        self._probe = client.register_script(PROBE)
        self._renew = client.register_script(RENEW)
        self._healthy = True
        self._unready_after_s = unready_after_s
        self._clock = clock
        #: when the failing streak began and its latest failure (``clock``); None: none
        self._failing_since: float | None = None
        self._last_failure = 0.0
        #: failures so far: a catch-up that overlapped one is not the last word
        self._failures = 0
        #: a failure happened since held slots were last renewed (module docstring)
        self._renew_due = False
        self._catching_up = asyncio.Lock()
        self._catch_up_task: asyncio.Task[None] | None = None
        #: aclose began: a settlement applied now starts no catch-up
        self._closing = False
        self._dropping = False
        #: ops whose last batch had calls the script refused (logged once per episode)
        self._refusing: set[str] = set()
        # Settlements and renewals are written one at a time (see ``leases``).
        self._writes = asyncio.Lock()
        self._leases: SlotLeases[TenantKeys] = SlotLeases(
            self._renew_all,
            interval_s=lease_renew_s,
            lock=self._writes,
            name="limits-leases",
            on_failure=lambda exc: self._failed("renew", exc),
            on_success=self._succeeded,
        )
        self._probe_interval_s = probe_interval_s
        self._prober: asyncio.Task[None] | None = None
        self._flusher: Flusher[_Settlement] = Flusher(
            self._apply,
            name="limits-settlements",
            max_pending=max_pending,
            # Requests ending close together share one pipelined write.
            linger_s=_SETTLE_LINGER_S,
            on_failure=lambda exc: self._failed("settle", exc),
            on_success=self._succeeded,
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        password: str | None = None,
        timeout_s: float = 0.05,
        max_connections: int = 64,
        **kwargs: Any,
    ) -> RedisLimitsStore:
        """A store on its own connection pool (``rediss://`` is TLS)."""
        pool = BlockingConnectionPool.from_url(
            url,
            password=password,
            max_connections=max_connections,
            # Waiting for a free connection is bounded by the call's own timeout.
            timeout=None,
            # No socket_timeout: redis-py applies it to writes with
            # asyncio.wait_for, which on Python 3.11 swallows a cancellation
            # that lands as the write completes (CPython gh-86296): a cancelled
            # request would go on, and a flusher being closed would never stop.
            # Every call is bounded by its own asyncio.timeout instead.
            socket_timeout=None,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        client = Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
        return cls(client, timeout_s=timeout_s, secret=password, **kwargs)

    # -- lifecycle ---------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False from a failed call to the next successful one."""
        return self._healthy

    @property
    def ready(self) -> bool:
        """False once every call has failed for ``unready_after_s`` (module docstring)."""
        since = self._failing_since
        return since is None or self._last_failure - since < self._unready_after_s

    @property
    def pending_settlements(self) -> int:
        return self._flusher.pending

    @property
    def leases_held(self) -> int:
        """Concurrency slots this store renews (its requests in flight)."""
        return self._leases.held

    async def start(self) -> None:
        self._flusher.start()
        self._leases.start()
        # Not fatal: a replica may start while Redis is away, and recovers with it.
        await self.probe()
        if self._probe_interval_s is not None and self._prober is None:
            self._prober = asyncio.create_task(
                self._probe_every(self._probe_interval_s), name="limits-probe"
            )

    async def _probe_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.probe()
            except Exception as exc:  # a bug must not stop the probe (nor freeze `healthy`)
                self._failed("probe", exc)

    async def probe(self) -> bool:
        """A write through a script within the timeout (what a reservation needs:
        PING alone passes on a read-only or full server); updates ``healthy``."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._probe(keys=[self._prefix + "probe"])
        except _STORE_ERRORS as exc:
            self._failed("probe", exc)
            return False
        finally:
            self._metrics.limits_store_call("probe", time.perf_counter() - started)
        if self._renew_due:
            # Healthy means this replica's running requests hold their slots again.
            try:
                await self._catch_up()
            except _STORE_ERRORS:
                return False
        self._succeeded()
        return True

    async def flush(self, timeout_s: float) -> bool:
        return await self._flusher.flush(timeout_s)

    async def aclose(self, timeout_s: float = 5.0) -> int:
        # Slots still held stop being renewed: they expire with their leases.
        self._closing = True
        await self._leases.aclose()
        catching_up, self._catch_up_task = self._catch_up_task, None
        if catching_up is not None:
            catching_up.cancel()
            await asyncio.gather(catching_up, return_exceptions=True)
        prober, self._prober = self._prober, None
        if prober is not None:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober
        unapplied = await self._flusher.aclose(timeout_s)
        if unapplied:
            log.warning(
                "limits store closed with %d settlements not applied "
                "(their reservations stay charged until their lease ends)",
                unapplied,
            )
        await self._client.aclose()
        await self._client.connection_pool.aclose()
        return unapplied

    # -- decisions ---------------------------------------------------------------

    def keys(self, tenant: str) -> TenantKeys:
        found = self._keys.get(tenant)
        if found is None:
            found = self._keys[tenant] = tenant_keys(self._prefix, tenant)
        return found

    def reserve_now(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold | None:
        return None  # the shared counters are Redis's to judge

    async def reserve(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold:
        want = charges(limits, tokens, concurrent=concurrent)
        if limits.unlimited:
            return Hold(tenant, limits)
        if self._renew_due:
            # After an outage this replica's slots come back before it admits more.
            try:
                await self._catch_up()
            except _STORE_ERRORS as exc:
                if self._on_error == "open":
                    return Hold(tenant, limits, checked=False)
                raise GatewayError("limits_unavailable") from exc
        keys = self.keys(tenant)
        # A hold with token limits is registered (even with 0 tokens: a settlement
        # may still charge real usage); an entry nobody settles is pruned after its lease.
        register = limits.tokens_per_minute is not None or limits.tokens_per_day is not None
        hold_id = os.urandom(12).hex() if register or want.slot else ""
        args = (
            limits.requests_per_minute or 0,
            limits.tokens_per_minute or 0,
            want.minute_tokens,
            limits.tokens_per_day or 0,
            want.day_tokens,
            (limits.max_concurrent_requests or 0) if want.slot else 0,
            hold_id,
            self._lease_ms + max(0, round(wait_s * 1000)),
            1 if register else 0,
            self._slot_lease_ms,
        )
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s):
                raw = await self._reserve(keys=keys.reserve, args=args)
        except _STORE_ERRORS as exc:
            if not isinstance(exc, OutOfMemoryError):
                # OOM is the server's answer before the script ran (its shebang,
                # see ``scripts``): nothing was taken, so there is nothing to void.
                self._void(keys, hold_id)
            self._failed("reserve", exc)
            if self._on_error == "open":
                return Hold(tenant, limits, checked=False)
            raise GatewayError("limits_unavailable") from exc
        except asyncio.CancelledError:
            self._void(keys, hold_id)
            raise
        finally:
            self._metrics.limits_store_call("reserve", time.perf_counter() - started)
        self._succeeded()
        refused, requests, tokens_level, until_midnight, day = raw
        verdict = Verdict(
            int(refused), _float(requests), _float(tokens_level), _float(until_midnight) or 0.0
        )
        headers = judge(limits, want, verdict)  # raises on refusal
        if want.slot:
            # Renewed until settled, at most as long as the hold's own lease.
            self._leases.add(keys, hold_id, self._lease_s + max(0.0, wait_s))
        return Hold(
            tenant,
            limits,
            minute_tokens=want.minute_tokens,
            day_tokens=want.day_tokens,
            day=int(day) if limits.tokens_per_day is not None else None,
            slot=hold_id if want.slot else None,
            id=hold_id if register else "",
            _headers=headers,
        )

    def settle(self, hold: Hold, used_tokens: int) -> None:
        if not hold.claim_settlement(used_tokens) or not hold.checked:
            return
        if hold.slot is not None:
            self._leases.discard(self.keys(hold.tenant), hold.slot)
        limits = hold.limits
        tpm = limits.tokens_per_minute or 0
        minute_refund = hold.minute_tokens - used_tokens if tpm and hold.id else 0
        day_refund = hold.day_tokens - used_tokens if hold.day is not None and hold.id else 0
        if hold.slot is None and not minute_refund and not day_refund:
            return
        self._enqueue(
            _Settlement(
                self.keys(hold.tenant),
                hold.id or (hold.slot or ""),
                tpm,
                minute_refund,
                hold.day if hold.day is not None else -1,
                day_refund,
            )
        )

    def _void(self, keys: TenantKeys, hold_id: str) -> None:
        """A reservation whose answer was lost: free its slot, keep its tokens charged."""
        if hold_id:
            self._enqueue(_Settlement(keys, hold_id, 0, 0, -1, 0, void=True))

    def _enqueue(self, settlement: _Settlement) -> None:
        if self._flusher.put(settlement):
            self._dropping = False
            return
        self._metrics.limits_store_error("settle")
        if not self._dropping:  # once per episode
            self._dropping = True
            log.warning(
                "limits settlement queue full or closed: settlements are dropped "
                "(their reservations stay charged until their lease ends)"
            )

    async def _apply(self, batch: list[_Settlement]) -> None:
        # (settlements are idempotent: a batch sent again applies none twice)
        calls = [
            (
                len(s.keys.settle),
                *s.keys.settle,
                s.hold,
                s.tpm,
                s.minute_refund,
                s.day,
                s.day_refund,
                1 if s.void else 0,
                self._lease_ms,
            )
            for s in batch
        ]
        async with self._writes:  # after any renewal naming the same slots
            await self._pipelined("settle", self._settle, calls)

    async def _catch_up(self) -> None:
        """Renew every held slot now, after a failure; once for all who wait.
        Raises the store's error (counted as a ``renew`` failure)."""
        async with self._catching_up:
            if not self._renew_due:
                return  # another waiter's catch-up did it
            failures = self._failures
            try:
                await self._leases.renew_now()
            except _STORE_ERRORS as exc:
                self._failed("renew", exc)
                raise
            if self._failures == failures:
                self._renew_due = False

    async def _catch_up_quietly(self) -> None:
        with contextlib.suppress(*_STORE_ERRORS):  # counted by _catch_up; retried
            await self._catch_up()

    async def _renew_all(self, batch: list[tuple[TenantKeys, list[str]]]) -> None:
        """One round trip renewing every slot held (``leases`` calls it, under the lock)."""
        calls = [(1, keys.slots, self._slot_lease_ms, *slots) for keys, slots in batch]
        results = await self._pipelined("renew", self._renew, calls)
        added = sum(int(r) for r in results if not isinstance(r, Exception))
        if added:  # expired while renewals failed, yet their requests still run
            log.warning("limits: %d expired slots of running requests taken again", added)

    async def _pipelined(
        self, op: str, script: AsyncScript, calls: list[tuple[Any, ...]]
    ) -> list[Any]:
        """``calls`` of ``script`` in one pipeline, within one timeout per 64; the
        script loaded again when the server lost it (a restart, SCRIPT FLUSH)."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s * (1 + len(calls) // _SCRIPTS_PER_TIMEOUT)):
                results = await self._evalsha_all(script.sha, calls)
                if any(isinstance(r, NoScriptError) for r in results):
                    await self._client.script_load(script.script)
                    results = await self._evalsha_all(script.sha, calls)
        finally:
            self._metrics.limits_store_call(op, time.perf_counter() - started)
        # A server state (read-only after a failover, loading, out of memory,
        # cluster moves: ResponseError's subclasses, NOSCRIPT among them) passes:
        # the whole batch is sent again later (settlements with backoff, renewals
        # at the next interval). Only a plain ResponseError is the script's own (a
        # bug, a key of the wrong type): sending it again would fail again, so it
        # is counted and dropped.
        for result in results:
            if isinstance(result, Exception) and type(result) is not ResponseError:
                raise result
        refused = [r for r in results if isinstance(r, Exception)]
        for _ in refused:
            self._metrics.limits_store_error(op)
        if refused and op not in self._refusing:
            log.error(
                "limits %s scripts refused by the store (%d in this batch): %s",
                op,
                len(refused),
                self._why(refused[0]),
            )
        if refused:
            self._refusing.add(op)
        else:
            self._refusing.discard(op)
        return results

    async def _evalsha_all(self, sha: str, calls: list[tuple[Any, ...]]) -> list[Any]:
        # EVALSHA queued as is: a Script in a pipeline costs a SCRIPT EXISTS
        # round trip per batch.
        async with self._client.pipeline(transaction=False) as pipe:
            for args in calls:
                pipe.evalsha(sha, *args)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    # -- health ------------------------------------------------------------------

    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError) and not str(exc):
            return f"TimeoutError: no answer within {self._timeout_s * 1000:g} ms"
        text = f"{type(exc).__name__}: {exc}"
        if self._secret:
            text = text.replace(self._secret, "***")
        return text[:300]

    def _failed(self, op: str, exc: BaseException) -> None:
        self._metrics.limits_store_error(op)
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        self._last_failure = now
        self._failures += 1
        self._renew_due = True
        if self._healthy:
            self._healthy = False
            log.warning(
                "limits store unavailable (%s, during %s); on_error=%s",
                self._why(exc),
                op,
                self._on_error,
            )

    def _succeeded(self) -> None:
        self._failing_since = None
        if not self._healthy:
            self._healthy = True
            log.warning("limits store available again")
        task = self._catch_up_task
        if self._renew_due and not self._closing and (task is None or task.done()):
            # A settlement or a renewal got through: the held slots come back now.
            self._catch_up_task = asyncio.create_task(
                self._catch_up_quietly(), name="limits-catch-up"
            )
