"""Releases end to end (spec §18): one alias over two simulators, ``old`` serving
the stable route and ``new`` the canary. The split and its stickiness, the
canary kept out while unready, the fallback (refused, reset and 5xx before
the head; never after the first byte, never on a timeout), the gate's
rollbacks, and the receipts and metrics against what each worker saw."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import socket
import struct
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from gateway.core.release import is_canary
from gateway.testing.harness import Gateway, default_policy, write_config
from gateway.testing.simulator import Simulator
from tests.support.jwt import make_claims, sign_rs256
from tests.support.poll import eventually
from tests.support.stack import chat_body, issuers, sse_data, worker_posts

T = TypeVar("T")


def _route(name: str) -> str:
    return "/srv/mosaic-models/" + hashlib.sha256(name.encode()).hexdigest()


OLD, NEW = _route("chat-old"), _route("chat-new")
ALIAS = "chat-model"


@cache
def token(sub: str) -> str:
    return sign_rs256(make_claims(tenant="acme", sub=sub, ttl=600))


def canary_subject(percent: float, *, canary: bool, start: int = 0) -> str:
    """The first subject from ``start`` on whose cohort is (or is not) the canary's."""
    n = start
    while is_canary("chat", f"acme\nuser-{n}", percent) is not canary:
        n += 1
    return f"user-{n}"


class Pod:
    def __init__(self, directory: Path, old: Simulator, new: Simulator, gw: Gateway) -> None:
        self.dir, self.old, self.new, self.gw = directory, old, new, gw

    @property
    def rt(self) -> Any:
        return self.gw.runtime

    def post(self, sub: str, *, stream: bool = False, text: str = "hello") -> httpx.Response:
        with httpx.Client(base_url=self.gw.base_url, timeout=20) as client:
            return client.post(
                "/v1/chat/completions",
                json=chat_body(text, model=ALIAS, stream=stream),
                headers={"authorization": f"Bearer {token(sub)}"},
            )

    def receipt(self, response: httpx.Response) -> dict[str, Any]:
        from gateway.testing.harness import wait_receipt

        return wait_receipt(self.rt.config.audit.path, response.headers["x-request-id"])

    def metric(self, name: str, **labels: str) -> float:
        value = self.rt.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else float(value)

    def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self.gw.server.server.servers[0].get_loop()
        return asyncio.run_coroutine_threadsafe(coro, loop).result(10)

    def permits_back(self) -> bool:
        in_use = self.rt.table.admissions.in_use
        gauges = [self.metric("gateway_permits_in_use", upstream=u) for u in ("old", "new")]
        return bool(in_use == 0 and gauges == [0.0, 0.0])


def _config(tmp_path: Path, old: Simulator, new: Simulator, **release: Any) -> Path:
    new_extra = release.pop("new_extra", {})
    fields: dict[str, Any] = {
        "name": "chat",
        "stable": OLD,
        "canary": NEW,
        "canary_percent": 50,
        "cohort": "subject",
        "fallback": True,
    }
    fields.update(release)
    policy = default_policy("acme", models={ALIAS: "release:chat"})
    return write_config(
        tmp_path,
        upstream_port=0,
        policies={"acme": policy},
        issuers=issuers(),
        upstreams=[
            {"name": "old", "base_url": old.base_url, "routes": [OLD], "capacity": 4},
            {"name": "new", "base_url": new.base_url, "routes": [NEW], "capacity": 4, **new_extra},
        ],
        releases=[fields],
    )


@contextmanager
def pod(tmp_path: Path, **release: Any) -> Iterator[Pod]:
    old, new = Simulator(model_ids=[OLD]), Simulator(model_ids=[NEW])
    old.start()
    new.start()
    try:
        with Gateway(_config(tmp_path, old, new, **release)) as gateway:
            running = Pod(tmp_path, old, new, gateway)
            assert gateway.wait_ready(), "the gateway never saw the stable route ready"
            assert eventually(lambda: gateway.runtime.readiness.ready(NEW), 10)
            yield running
    finally:
        old.stop()
        new.stop()


# -- assignment --------------------------------------------------------------------


def test_the_split_holds_each_subject_keeps_its_arm_and_the_books_agree(tmp_path: Path) -> None:
    subjects = [f"user-{i}" for i in range(300)]
    with pod(tmp_path, canary_percent=50) as p:
        arms = {}
        for sub in subjects:
            response = p.post(sub)
            assert response.status_code == 200 and response.json()["model"] == ALIAS
            release = p.receipt(response)["release"]
            assert release["name"] == "chat" and release["fallback_from"] is None
            arms[sub] = release["arm"]
        # Exactly the spec's hash, so within the binomial bound of its fair coin.
        expected = {s: "canary" if is_canary("chat", f"acme\n{s}", 50) else "stable" for s in arms}
        assert arms == expected
        canaries = sum(arm == "canary" for arm in arms.values())
        assert abs(canaries - 150) < 4 * math.sqrt(300 * 0.25)
        for sub in subjects[:40]:
            again = p.receipt(p.post(sub))
            assert again["release"]["arm"] == arms[sub], "sticky per subject"
            assert again["upstream"] == ("new" if arms[sub] == "canary" else "old")
            assert again["route"] == (NEW if arms[sub] == "canary" else OLD)
        # What each worker saw is what the gateway counted.
        again_canaries = sum(arms[s] == "canary" for s in subjects[:40])
        new_posts, old_posts = len(worker_posts(p.new)), len(worker_posts(p.old))
        assert new_posts == canaries + again_canaries
        assert old_posts == 340 - new_posts
        assert {r.model for r in worker_posts(p.new)} == {NEW}
        assert {r.model for r in worker_posts(p.old)} == {OLD}
        counted = "gateway_release_requests_total"
        assert eventually(
            lambda: (
                (
                    p.metric(counted, release="chat", arm="canary", outcome="complete"),
                    p.metric(counted, release="chat", arm="stable", outcome="complete"),
                )
                == (new_posts, old_posts)
            )
        )
        ttft = "gateway_release_ttft_seconds_count"
        assert p.metric(ttft, release="chat", arm="canary") == new_posts
        assert p.metric("gateway_release_canary_percent", release="chat") == 50
        assert eventually(p.permits_back)


def test_the_canary_gets_nothing_while_unready(tmp_path: Path) -> None:
    with pod(tmp_path, canary_percent=100) as p:
        p.new.set_status(NEW, "unloaded")
        assert eventually(lambda: not p.rt.readiness.ready(NEW), 5)
        with httpx.Client(base_url=p.gw.base_url, timeout=10) as client:
            ready = client.get("/readyz")
            assert ready.status_code == 200, "the release is ready when stable is"
            assert ready.json()["routes"][NEW]["ready"] is False
            models = client.get("/v1/models", headers={"authorization": f"Bearer {token('a')}"})
            assert [(m["id"], m["status"]) for m in models.json()["data"]] == [(ALIAS, "loaded")]
        receipts = [p.receipt(p.post(f"user-{i}")) for i in range(10)]
        assert {(r["release"]["arm"], r["upstream"]) for r in receipts} == {("stable", "old")}
        assert worker_posts(p.new) == []
        p.new.set_status(NEW, "loaded")
        assert eventually(lambda: p.rt.readiness.ready(NEW), 5)
        assert p.receipt(p.post("user-1"))["release"]["arm"] == "canary"
        # Stable down takes the release out, though the canary is ready.
        p.old.set_status(OLD, "unloaded")
        assert eventually(lambda: not p.rt.accepting(), 5)


# -- fallback ------------------------------------------------------------------------


def _canary_fell_back(p: Pod, response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    receipt = p.receipt(response)
    assert receipt["release"] == {"name": "chat", "arm": "stable", "fallback_from": "canary"}
    assert (receipt["upstream"], receipt["route"], receipt["outcome"]) == ("old", OLD, "complete")
    return receipt


def test_a_refused_canary_falls_back_to_stable_once(tmp_path: Path) -> None:
    # A slow readiness poll: the canary still counts as ready when its worker goes.
    with pod(tmp_path, canary_percent=50, new_extra={"readiness_poll_s": 60}) as p:
        p.new.stop()
        sub = canary_subject(50, canary=True)
        for stream in (False, True):
            response = p.post(sub, stream=stream)
            _canary_fell_back(p, response)
            if stream:
                assert sse_data(response.text)[-1] == "[DONE]"
        assert len(worker_posts(p.old)) == 2
        # The failed attempts count for the canary, the answers for stable.
        counted = "gateway_release_requests_total"
        assert eventually(
            lambda: p.metric(counted, release="chat", arm="stable", outcome="complete") == 2
        )
        canary_failed = sum(
            p.metric(counted, release="chat", arm="canary", outcome=outcome)
            for outcome in ("upstream_error", "incomplete")
        )
        assert canary_failed == 2
        assert eventually(p.permits_back)


def test_without_fallback_a_refused_canary_is_a_502(tmp_path: Path) -> None:
    with pod(tmp_path, fallback=False, new_extra={"readiness_poll_s": 60}) as p:
        p.new.stop()
        response = p.post(canary_subject(50, canary=True))
        assert (response.status_code, response.json()["error"]["code"]) == (
            502,
            "upstream_unavailable",
        )
        receipt = p.receipt(response)
        assert receipt["release"] == {"name": "chat", "arm": "canary", "fallback_from": None}
        assert worker_posts(p.old) == []
        assert eventually(p.permits_back)


@contextmanager
def resetting(port: int) -> Iterator[list[int]]:
    """A listener on ``port`` that reads each request's first bytes and answers
    with a TCP reset, before any response head; yields the count of resets."""
    resets: list[int] = []
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(16)
    server.settimeout(0.05)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                conn.recv(65_536)
                # SO_LINGER 0: close sends a reset.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            resets.append(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield resets
    finally:
        stop.set()
        thread.join(5)
        server.close()


def test_a_canary_reset_before_its_head_falls_back(tmp_path: Path) -> None:
    with pod(tmp_path, new_extra={"readiness_poll_s": 60}) as p:
        port = p.new.port
        p.new.stop()
        with resetting(port) as resets:
            for stream in (False, True):
                _canary_fell_back(p, p.post(canary_subject(50, canary=True), stream=stream))
        assert len(resets) == 2 and len(worker_posts(p.old)) == 2
        assert eventually(p.permits_back)


@pytest.mark.parametrize(
    ("knobs", "stream"),
    [({"status": 500}, False), ({"status": 503}, True)],
    ids=["5xx", "5xx-stream"],
)
def test_a_canary_failing_before_its_head_falls_back(
    tmp_path: Path, knobs: dict[str, Any], stream: bool
) -> None:
    with pod(tmp_path) as p:
        p.new.set_knobs(**knobs)
        response = p.post(canary_subject(50, canary=True), stream=stream)
        _canary_fell_back(p, response)
        assert len(worker_posts(p.new)) == 1 and len(worker_posts(p.old)) == 1
        # A stable cohort is untouched by the canary's trouble.
        stable = p.receipt(p.post(canary_subject(50, canary=False)))
        assert stable["release"] == {"name": "chat", "arm": "stable", "fallback_from": None}
        assert len(worker_posts(p.new)) == 1
        assert eventually(p.permits_back)


def test_a_stable_failure_falls_back_to_a_ready_canary(tmp_path: Path) -> None:
    with pod(tmp_path) as p:
        p.old.set_knobs(status=500)
        receipt = p.receipt(p.post(canary_subject(50, canary=False)))
        assert receipt["release"] == {"name": "chat", "arm": "canary", "fallback_from": "stable"}
        assert receipt["upstream"] == "new" and receipt["outcome"] == "complete"
        assert eventually(p.permits_back)


def test_no_fallback_after_the_first_byte_or_on_a_timeout(tmp_path: Path) -> None:
    with pod(tmp_path, new_extra={"first_event_timeout_s": 0.5}) as p:
        sub = canary_subject(50, canary=True)
        p.new.set_knobs(fault="close_mid", chunks=20, delay_ms=5)
        cut = p.post(sub, stream=True)
        assert cut.status_code == 200 and "[DONE]" not in cut.text
        receipt = p.receipt(cut)
        assert receipt["release"] == {"name": "chat", "arm": "canary", "fallback_from": None}
        assert receipt["upstream"] == "new" and receipt["outcome"] != "complete"
        p.new.set_knobs(fault="hang_headers")
        hung = p.post(sub)
        assert (hung.status_code, hung.json()["error"]["code"]) == (504, "upstream_timeout")
        assert p.receipt(hung)["release"]["fallback_from"] is None
        assert worker_posts(p.old) == [], "neither was sent to stable"
        assert eventually(p.permits_back, 10)


# -- the gate --------------------------------------------------------------------------


GATE = {"window_s": 60, "min_requests": 5, "max_failure_rate_delta": 0.05}


def _until_rolled_back(p: Pod, subjects: int = 60, **post: Any) -> list[dict[str, Any]]:
    """Traffic from many subjects until the gate acts; their receipts."""
    receipts = []
    for i in range(subjects):
        receipts.append(p.receipt(p.post(f"user-{i}", **post)))
        if p.rt.table.releases.percent("chat") == 0:
            break
    assert eventually(lambda: p.rt.table.releases.percent("chat") == 0, 5), "never rolled back"
    return receipts


def test_a_failing_canary_is_rolled_back_by_its_gate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.releases")
    with pod(tmp_path, gate=GATE) as p:
        p.new.set_knobs(status=500)
        receipts = _until_rolled_back(p)
        # Every caller got an answer: the canary's failures fell back.
        assert {r["outcome"] for r in receipts} == {"complete"}
        assert p.metric("gateway_release_rollbacks_total", release="chat") == 1
        assert eventually(
            lambda: p.metric("gateway_release_canary_percent", release="chat") == 0, 3
        )
        lines = [r.getMessage() for r in caplog.records if "rolled back" in r.getMessage()]
        assert len(lines) == 1 and "failure_rate" in lines[0]
        # Persisted by the sync it woke: the store holds the decision every replica follows.
        assert eventually(lambda: "chat" in p.on_loop(p.rt.state.releases.overrides()), 3)
        standing = p.on_loop(p.rt.state.releases.overrides())
        assert standing["chat"].state == "rolled_back" and standing["chat"].percent == 0
        before = len(worker_posts(p.new))
        after = [p.receipt(p.post(f"user-{i}")) for i in range(20)]
        assert {r["release"]["arm"] for r in after} == {"stable"}
        assert len(worker_posts(p.new)) == before, "the canary gets nothing more"
        # A SIGHUP with a new percent: the rollback stands (until `release clear`).
        _config(p.dir, p.old, p.new, gate=GATE, canary_percent=80)
        assert p.on_loop(p.rt.reload()) == []
        assert p.rt.table.releases.percent("chat") == 0
        assert p.rt.config.releases[0].canary_percent == 80
        assert eventually(p.permits_back)


def test_a_slow_canary_is_rolled_back_by_its_ttft_gate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.releases")
    with pod(tmp_path, gate={**GATE, "max_ttft_p95_ratio": 2.0}) as p:
        p.new.set_knobs(first_delay_ms=150)
        receipts = _until_rolled_back(p, stream=True)
        assert {r["outcome"] for r in receipts} == {"complete"}
        lines = [r.getMessage() for r in caplog.records if "rolled back" in r.getMessage()]
        assert len(lines) == 1 and "ttft_p95" in lines[0]
        assert p.metric("gateway_release_rollbacks_total", release="chat") == 1
