"""Admission's pure fair-queue core on a fake clock: weights, the scheduler, a
state machine."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from gateway.admission.core import FairQueueCore, Ticket, TicketState, request_weight
from gateway.config.policy import Cost
from gateway.core.errors import GatewayError


def ticket(
    tenant: str,
    weight: int = 1,
    *,
    share: float = 1.0,
    max_permits: int = 8,
    now: float = 0.0,
    timeout_s: float = 1e9,
) -> Ticket:
    return Ticket(tenant, weight, share, max_permits, now, now + timeout_s)


def saturate(core: FairQueueCore, tickets: list[Ticket], now: float = 0.0) -> list[Ticket]:
    for t in tickets:
        core.enqueue(t)
    return core.grants(now)


# -- request_weight ---------------------------------------------------------


def test_request_weight_sums_base_and_media_parts() -> None:
    cost = Cost(base=1, image=2, audio=1, video=3)
    assert request_weight(cost, []) == 1
    assert request_weight(cost, ["image", "image", "video", "audio"]) == 1 + 2 + 2 + 3 + 1
    assert request_weight(Cost(base=0), []) == 0
    with pytest.raises(ValueError):
        request_weight(cost, ["text"])


# -- the core ---------------------------------------------------------------


def test_capacity_and_max_permits_bound_grants() -> None:
    core = FairQueueCore(capacity=4, max_queue=100)
    granted = saturate(core, [ticket("a", max_permits=3) for _ in range(5)])
    assert [t.tenant for t in granted] == ["a"] * 3
    assert core.held("a") == 3
    granted = saturate(core, [ticket("b", max_permits=4) for _ in range(5)])
    assert len(granted) == 1
    assert core.in_use == 4
    assert core.queue_depth == 6


def run_saturated(
    core: FairQueueCore, holders: list[Ticket], admissions: int, refill: dict[str, Ticket]
) -> Counter[str]:
    """Release the oldest holder and top up its tenant, ``admissions`` times."""
    counts: Counter[str] = Counter()
    now = 0.0
    while sum(counts.values()) < admissions:
        now += 1.0
        oldest = holders.pop(0)
        core.release(oldest, now)
        template = refill[oldest.tenant]
        core.enqueue(
            ticket(
                oldest.tenant,
                template.weight,
                share=template.share,
                max_permits=template.max_permits,
                now=now,
            )
        )
        for t in core.grants(now):
            counts[t.tenant] += 1
            holders.append(t)
        assert core.in_use <= core.capacity
    return counts


@pytest.mark.parametrize("capacity", [1, 4, 8])
def test_shares_one_to_three_split_admissions_one_to_three(capacity: int) -> None:
    core = FairQueueCore(capacity=capacity, max_queue=10_000)
    light = ticket("light", share=1, max_permits=capacity)
    heavy = ticket("heavy", share=3, max_permits=capacity)
    backlog = []
    for _ in range(50):
        backlog += [ticket("light", share=1, max_permits=capacity)]
        backlog += [ticket("heavy", share=3, max_permits=capacity)]
    holders = saturate(core, backlog)
    counts = run_saturated(core, holders, 400, {"light": light, "heavy": heavy})
    ratio = counts["light"] / counts["heavy"]
    # 400 admissions at 1:3 are 100:300; allow ±10% on the ratio
    assert (1 / 3) * 0.9 <= ratio <= (1 / 3) * 1.1, counts


def test_shares_divide_units_not_requests() -> None:
    # Equal shares, but one tenant's requests weigh 2: each gets half the units.
    core = FairQueueCore(capacity=4, max_queue=10_000)
    big = ticket("big", 2, max_permits=4)
    small = ticket("small", 1, max_permits=4)
    backlog = [ticket("big", 2, max_permits=4) for _ in range(20)]
    backlog += [ticket("small", 1, max_permits=4) for _ in range(20)]
    holders = saturate(core, backlog)
    counts = run_saturated(core, holders, 300, {"big": big, "small": small})
    units_ratio = 2 * counts["big"] / counts["small"]
    assert 0.9 <= units_ratio <= 1.1, counts


def test_low_share_tenant_is_not_starved() -> None:
    core = FairQueueCore(capacity=2, max_queue=10_000)
    hog = ticket("hog", share=10, max_permits=2)
    holders = saturate(core, [ticket("hog", share=10, max_permits=2) for _ in range(50)])
    meek = [ticket("meek", share=0.1, max_permits=2) for _ in range(3)]
    for t in meek:
        core.enqueue(t)
    counts: Counter[str] = Counter()
    now = 0.0
    steps = 0
    while any(t.state is TicketState.WAITING for t in meek):
        steps += 1
        assert steps < 1000, "the low-share tenant starved"
        now += 1
        oldest = holders.pop(0)
        core.release(oldest, now)
        if oldest.tenant == "hog":
            core.enqueue(ticket("hog", share=hog.share, max_permits=2, now=now))
        for t in core.grants(now):
            counts[t.tenant] += 1
            holders.append(t)
    # The first meek request arrives with start tag V and goes at once; the
    # next two each wait for the hog to spend 1/0.1 = 10 virtual units.
    assert counts["hog"] <= 2 * 100 + 2


def test_heavy_head_is_not_starved_by_light_requests() -> None:
    core = FairQueueCore(capacity=4, max_queue=10_000)
    holders = saturate(core, [ticket("light", share=10, max_permits=4) for _ in range(4)])
    heavy = ticket("heavy", 3, share=1, max_permits=4)
    core.enqueue(heavy)
    assert core.grants(0.0) == []
    releases = 0
    while heavy.state is TicketState.WAITING:
        releases += 1
        assert releases < 20, "the weight-3 request starved"
        core.release(holders.pop(0), float(releases))
        core.enqueue(ticket("light", share=10, max_permits=4, now=float(releases)))
        holders.extend(core.grants(float(releases)))
    # It had the turn at once (start tag V), so units were reserved for it
    # until three were free: no light request was admitted meanwhile.
    assert releases == 3
    assert holders[-1] is heavy
    assert core.held("heavy") == 3


def test_fifo_within_a_tenant_even_behind_a_heavy_head() -> None:
    core = FairQueueCore(capacity=4, max_queue=100)
    blocker = saturate(core, [ticket("x", 3, max_permits=4)])
    assert len(blocker) == 1
    queued = [ticket("a", w, max_permits=4) for w in (3, 1, 1, 2, 1)]
    for t in queued:
        core.enqueue(t)
    order: list[Ticket] = []
    order += core.grants(1.0)
    # The weight-3 head does not fit in 1 free unit and nothing jumps it.
    assert order == []
    now = 1.0
    holders = list(blocker)
    while any(t.state is TicketState.WAITING for t in queued):
        now += 1
        core.release(holders.pop(0), now)
        granted = core.grants(now)
        order += granted
        holders += granted
    assert order == queued


def test_queue_full_is_429_with_retry_after() -> None:
    core = FairQueueCore(capacity=1, max_queue=2)
    saturate(core, [ticket("a"), ticket("a"), ticket("b")])
    with pytest.raises(GatewayError) as info:
        core.enqueue(ticket("c"))
    assert info.value.code == "queue_full"
    assert info.value.status == 429
    assert int(info.value.headers["Retry-After"]) >= 1
    assert core.queue_depth == 2


def test_queue_full_only_refuses_requests_that_would_wait() -> None:
    core = FairQueueCore(capacity=2, max_queue=0)
    first = ticket("a")
    core.enqueue(first)
    assert core.grants(0.0) == [first]
    core.enqueue(ticket("a"))
    with pytest.raises(GatewayError, match="queue_full"):
        core.enqueue(ticket("a"))


def test_retry_after_estimates_the_backlog_drain_time() -> None:
    core = FairQueueCore(capacity=2, max_queue=1)
    held = saturate(core, [ticket("a"), ticket("a")])
    assert core.retry_after_s() == 1  # nothing observed yet
    core.release(held[0], 10.0)  # held for 10 s
    core.grants(10.0)
    core.enqueue(ticket("a", now=10.0))
    core.enqueue(ticket("a", now=10.0))
    # 2 units in use + 1 queued, 10 s each, over 2 units of capacity
    assert core.retry_after_s() == 15
    with pytest.raises(GatewayError) as info:
        core.enqueue(ticket("a", now=10.0))
    assert info.value.headers["Retry-After"] == "15"


def test_weight_beyond_max_permits_or_capacity_is_400() -> None:
    core = FairQueueCore(capacity=4, max_queue=10)
    for bad in (ticket("a", 3, max_permits=2), ticket("a", 5, max_permits=8)):
        with pytest.raises(GatewayError) as info:
            core.enqueue(bad)
        assert info.value.code == "admission_weight_exceeded"
        assert info.value.status == 400
    assert core.queue_depth == 0


def test_weight_zero_is_admitted_without_units() -> None:
    core = FairQueueCore(capacity=1, max_queue=0)
    saturate(core, [ticket("a")])
    free = ticket("a", 0)
    core.enqueue(free)
    assert core.grants(0.0) == [free]
    assert core.in_use == 1
    core.release(free, 1.0)
    assert core.in_use == 1


def test_cancelled_waiter_frees_its_place_and_unblocks_others() -> None:
    core = FairQueueCore(capacity=2, max_queue=2)
    saturate(core, [ticket("x")])
    heavy = ticket("a", 2)
    light = ticket("b", 1)
    core.enqueue(heavy)
    core.enqueue(light)
    # heavy has the turn and one free unit is reserved for it
    assert core.grants(0.0) == []
    with pytest.raises(GatewayError, match="queue_full"):
        core.enqueue(ticket("c"))
    assert core.cancel(heavy)
    assert not core.cancel(heavy)
    assert core.grants(1.0) == [light]
    core.enqueue(ticket("c"))
    assert core.queue_depth == 1


def test_expire_withdraws_due_waiters_only() -> None:
    core = FairQueueCore(capacity=1, max_queue=10)
    saturate(core, [ticket("a")])
    soon = ticket("b", timeout_s=5)
    later = ticket("b", timeout_s=50)
    core.enqueue(soon)
    core.enqueue(later)
    assert core.expire(4.9) == []
    assert core.expire(5.0) == [soon]
    assert soon.state is TicketState.EXPIRED
    assert core.queue_depth == 1


def test_release_twice_is_refused_by_the_core() -> None:
    core = FairQueueCore(capacity=1, max_queue=1)
    (held,) = saturate(core, [ticket("a")])
    core.release(held, 1.0)
    with pytest.raises(ValueError):
        core.release(held, 2.0)
    assert core.in_use == 0


# -- the state machine --------------------------------------------------------

TENANTS = {"a": (1.0, 2), "b": (3.0, 4), "c": (0.5, 3)}  # share, max_permits
CAPACITY = 5
MAX_QUEUE = 6


class AdmissionMachine(RuleBasedStateMachine):
    waiting = Bundle("waiting")
    holding = Bundle("holding")

    def __init__(self) -> None:
        super().__init__()
        self.core = FairQueueCore(CAPACITY, MAX_QUEUE)
        self.now = 0.0
        self.tickets: list[Ticket] = []
        self.released: list[Ticket] = []
        self.granted_seq: dict[str, int] = {}

    def _grants(self) -> list[Ticket]:
        granted = self.core.grants(self.now)
        for t in granted:
            assert t.state is TicketState.HELD
            # FIFO within a tenant: nothing older of the same tenant still waits
            assert t.seq > self.granted_seq.get(t.tenant, -1) or t.weight == 0
            if t.weight:
                self.granted_seq[t.tenant] = t.seq
            assert t.weight == 0 or not any(
                o.tenant == t.tenant and o.state is TicketState.WAITING and o.seq < t.seq
                for o in self.tickets
            )
        # Work conservation: with the pool empty, some waiter always fits.
        if self.core.queue_depth:
            assert self.core.in_use > 0
        return granted

    @rule(
        target=waiting,
        tenant=st.sampled_from(sorted(TENANTS)),
        weight=st.integers(0, 5),
        timeout_s=st.sampled_from([1.0, 5.0, 30.0]),
    )
    def enqueue(self, tenant: str, weight: int, timeout_s: float) -> Ticket | None:
        share, max_permits = TENANTS[tenant]
        t = Ticket(tenant, weight, share, max_permits, self.now, self.now + timeout_s)
        depth = self.core.queue_depth
        try:
            self.core.enqueue(t)
        except GatewayError as exc:
            if weight > max_permits:
                assert exc.code == "admission_weight_exceeded"
            else:
                assert exc.code == "queue_full"
                assert depth == MAX_QUEUE
                assert int(exc.headers["Retry-After"]) >= 1
            assert self.core.queue_depth == depth
            return None
        self.tickets.append(t)
        return t

    @rule(target=holding)
    def grants(self) -> list[Ticket]:
        return self._grants()

    @rule(held=consumes(holding))
    def release(self, held: list[Ticket]) -> None:
        for t in held:
            if t.state is TicketState.HELD:
                self.core.release(t, self.now)
                self.released.append(t)

    @rule(t=waiting)
    def cancel(self, t: Ticket | None) -> None:
        if t is None:
            return
        was_waiting = t.state is TicketState.WAITING
        assert self.core.cancel(t) is was_waiting
        if was_waiting:
            assert t.state is TicketState.CANCELLED

    @rule(seconds=st.sampled_from([0.5, 2.0, 10.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        for t in self.core.expire(self.now):
            assert t.deadline <= self.now
            assert t.state is TicketState.EXPIRED

    @precondition(lambda self: bool(self.released))
    @rule()
    def release_twice_is_refused(self) -> None:
        in_use = self.core.in_use
        try:
            self.core.release(self.released[-1], self.now)
        except ValueError:
            pass
        else:
            raise AssertionError("a second release was accepted")
        assert self.core.in_use == in_use

    @invariant()
    def units_match_holders(self) -> None:
        held = [t for t in self.tickets if t.state is TicketState.HELD]
        assert self.core.in_use == sum(t.weight for t in held) <= CAPACITY
        for tenant, (_, max_permits) in TENANTS.items():
            mine = sum(t.weight for t in held if t.tenant == tenant)
            assert self.core.held(tenant) == mine <= max_permits
        waiting = [t for t in self.tickets if t.state is TicketState.WAITING]
        assert self.core.queue_depth == len(waiting) <= MAX_QUEUE
        assert all(t.deadline > self.now or t.state is not TicketState.WAITING for t in waiting)

    def teardown(self) -> None:
        # Everything that was ever granted is released exactly once.
        self._grants()
        for t in self.tickets:
            if t.state is TicketState.HELD:
                self.core.release(t, self.now)
        for t in self.tickets:
            assert t.state is not TicketState.HELD
            self.core.cancel(t)
        assert self.core.in_use == 0
        assert self.core.queue_depth == 0


TestAdmissionMachine = AdmissionMachine.TestCase
TestAdmissionMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, derandomize=True
)


# -- admit_now: the unloaded worker's shortcut ---------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from(sorted(TENANTS)), st.integers(0, 5)),
        st.tuples(st.just("release"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("wait"), st.just(""), st.integers(1, 3)),
    ),
    max_size=40,
)


def _state(core: FairQueueCore, tickets: list[Ticket]) -> tuple[object, ...]:
    finish = {name: queue.finish for name, queue in core._tenants.items()}
    return (
        [t.state for t in tickets],
        [t.granted_at for t in tickets],
        core.in_use,
        core.queue_depth,
        {tenant: core.held(tenant) for tenant in TENANTS},
        core._vtime,
        finish,
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ops=_OPS)
def test_admit_now_leaves_the_state_enqueue_and_grants_would(
    ops: list[tuple[str, str, int]],
) -> None:
    """Two pools, the same arrivals: one tries ``admit_now`` first, the other
    always queues and schedules. Every grant, wait, vtime and finish tag agree."""
    fast, slow = FairQueueCore(CAPACITY, MAX_QUEUE), FairQueueCore(CAPACITY, MAX_QUEUE)
    mine: list[Ticket] = []
    theirs: list[Ticket] = []
    now = 0.0
    shortcuts = 0
    for op, tenant, n in ops:
        if op == "arrive":
            share, max_permits = TENANTS[tenant]
            pair = [Ticket(tenant, n, share, max_permits, now, now + 5.0) for _ in range(2)]
            refused: list[str | None] = []
            for core, ticket, taken in ((fast, pair[0], True), (slow, pair[1], False)):
                try:
                    if not (taken and core.admit_now(ticket)):
                        core.enqueue(ticket)
                    elif ticket.weight:
                        shortcuts += 1
                    refused.append(None)
                except GatewayError as exc:
                    refused.append(exc.code)
            assert refused[0] == refused[1]
            if refused[0] is None:
                mine.append(pair[0])
                theirs.append(pair[1])
        elif op == "release":
            for tickets, core in ((mine, fast), (theirs, slow)):
                held = [t for t in tickets if t.state is TicketState.HELD]
                if held:
                    core.release(held[n % len(held)], now)
        else:
            now += n
            assert [t.seq for t in fast.expire(now)] == [t.seq for t in slow.expire(now)]
        fast.grants(now)
        slow.grants(now)
        assert _state(fast, mine) == _state(slow, theirs)


def test_admit_now_declines_while_anyone_waits() -> None:
    core = FairQueueCore(3, 4)
    assert core.admit_now(ticket("a", 2))
    core.enqueue(ticket("b", 2))  # one unit free: it waits for a second
    assert core.queue_depth == 1
    late = ticket("c", 1)
    # The free unit would fit it, but the waiter has the turn: nobody jumps it.
    assert not core.admit_now(late)
    assert late.state is TicketState.WAITING and late.seq == -1 and core.queue_depth == 1
