"""The exposition off the serving loop (spec §21, gateway/observe/exposition.py):
rendered in a worker thread, one render at a time shared by every scrape
waiting, never older than the scrape, at a bounded rate."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.observe.exposition import MIN_INTERVAL_S, Exposition, exposition_of
from gateway.observe.listener import MetricsListener
from tests.support.stack import Stack, chat_body, metrics_headers, running_stack


class _Probe:
    """A collector that records each collect (its thread and times), optionally
    holding it until released, or failing."""

    def __init__(self, hold_s: float = 0.0) -> None:
        self.threads: list[threading.Thread] = []
        self.spans: list[tuple[float, float]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        self.hold_s = hold_s

    def collect(self) -> Iterator[Metric]:
        began = time.monotonic()
        self.threads.append(threading.current_thread())
        self.entered.set()
        assert self.release.wait(10)
        time.sleep(self.hold_s)
        self.spans.append((began, time.monotonic()))
        if self.fail:
            raise RuntimeError("a broken collector")
        yield GaugeMetricFamily("probe_collects", "Collects so far.", value=len(self.spans))


def _value(text: bytes, name: str) -> float:
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in the exposition")


def _registry() -> tuple[CollectorRegistry, Counter, _Probe]:
    registry = CollectorRegistry()
    counter = Counter("things_total", "Things.", registry=registry)
    probe = _Probe()
    registry.register(probe)
    return registry, counter, probe


async def test_the_exposition_is_the_registrys_text_and_as_fresh_as_the_scrape() -> None:
    registry, counter, probe = _registry()
    exposition = Exposition(registry, min_interval_s=0.05)
    first = await exposition.render()
    assert _value(first, "things_total") == 0
    counter.inc()
    began = time.monotonic()
    second = await exposition.render()
    # The increment is in the next scrape: it waited for a render that began after it.
    assert _value(second, "things_total") == 1
    assert time.monotonic() - began >= 0.04  # the interval between renders
    assert exposition.renders == 2
    assert all(t is not threading.main_thread() for t in probe.threads), "off the loop"


async def test_concurrent_scrapes_share_one_render() -> None:
    registry, counter, probe = _registry()
    exposition = Exposition(registry)
    counter.inc(3)
    answers = await asyncio.gather(*(exposition.render() for _ in range(40)))
    assert exposition.renders == 1 and len(probe.spans) == 1
    assert len(set(answers)) == 1 and _value(answers[0], "things_total") == 3


async def test_a_scrape_during_a_render_waits_for_the_next_one() -> None:
    registry, counter, probe = _registry()
    exposition = Exposition(registry, min_interval_s=0.01)
    probe.release.clear()
    early = asyncio.create_task(exposition.render())
    assert await asyncio.to_thread(probe.entered.wait, 5)  # the render has begun
    counter.inc()  # after it began: the render under way may miss it
    late = [asyncio.create_task(exposition.render()) for _ in range(10)]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in late)
    probe.release.set()
    assert _value(await early, "things_total") in (0, 1)
    answers = await asyncio.gather(*late)
    assert {_value(a, "things_total") for a in answers} == {1}
    assert exposition.renders == 2, "the late scrapes shared the second render"


async def test_renders_are_spaced_by_the_interval_and_their_duration() -> None:
    registry, _, probe = _registry()
    probe.hold_s = 0.05
    exposition = Exposition(registry, min_interval_s=0.01, max_duty=0.25)
    for _ in range(3):
        await exposition.render()
    # A 50 ms render is followed by at least 3 x 50 ms without one (a quarter of the time).
    gaps = [b[0] - a[1] for a, b in zip(probe.spans, probe.spans[1:], strict=False)]
    assert len(gaps) == 2 and min(gaps) >= 0.14


async def test_a_failed_render_fails_its_scrapes_and_the_next_one_works() -> None:
    registry, _, probe = _registry()
    exposition = Exposition(registry, min_interval_s=0.01)
    probe.fail = True
    results = await asyncio.gather(*(exposition.render() for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    probe.fail = False
    assert b"things_total" in await exposition.render()


async def test_a_scrape_that_goes_away_leaves_the_render_to_the_others() -> None:
    registry, _, probe = _registry()
    exposition = Exposition(registry)
    probe.release.clear()
    leaving = asyncio.create_task(exposition.render())
    staying = asyncio.create_task(exposition.render())
    assert await asyncio.to_thread(probe.entered.wait, 5)
    leaving.cancel()
    probe.release.set()
    assert b"things_total" in await staying
    with pytest.raises(asyncio.CancelledError):
        await leaving


def test_one_exposition_per_registry() -> None:
    registry, _, _ = _registry()
    assert exposition_of(registry) is exposition_of(registry)
    assert exposition_of(registry) is not exposition_of(CollectorRegistry())


# ------------------------------------------- both listeners share the code


async def test_the_separate_listener_renders_once_for_concurrent_scrapes() -> None:
    registry, counter, _ = _registry()
    listener = MetricsListener(registry, "127.0.0.1", 0, "/metrics")
    await listener.start()
    try:
        counter.inc()

        async def scrape() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            try:
                writer.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                async with asyncio.timeout(10):
                    return await reader.read()  # to the close
            finally:
                writer.close()

        answers = await asyncio.gather(*(scrape() for _ in range(20)))
    finally:
        await listener.aclose()
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
    assert {_value(a.split(b"\r\n\r\n", 1)[1], "things_total") for a in answers} == {1}
    # The first scrape's render, and one more for every scrape that came during it.
    assert exposition_of(registry).renders <= 2


def test_the_main_listener_renders_at_a_bounded_rate(tmp_path: Path, _dev_secret: None) -> None:
    with running_stack(tmp_path) as stack:
        exposition = exposition_of(stack.runtime.metrics.registry)
        with stack.client(timeout=10) as client:
            assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
        before = exposition.renders
        began = time.monotonic()
        with ThreadPoolExecutor(20) as pool:
            responses = list(pool.map(lambda _: _scrape(stack), range(20)))
        elapsed = time.monotonic() - began
        assert all(r.status_code == 200 for r in responses)
        assert all(r.headers["content-length"] == str(len(r.content)) for r in responses)
        served = [
            s.value
            for r in responses
            for f in text_string_to_metric_families(r.text)
            for s in f.samples
            if s.name == "gateway_requests_total" and s.labels["endpoint"] == "chat.completions"
        ]
        assert served and set(served) == {1.0}, "every answer holds the request before it"
        renders = exposition.renders - before
        # At most one render per interval (plus the first) however many scrape.
        assert 1 <= renders <= 2 + elapsed / MIN_INTERVAL_S


def _scrape(stack: Stack) -> httpx.Response:
    return httpx.get(f"{stack.url}/metrics", headers=metrics_headers(), timeout=10)
