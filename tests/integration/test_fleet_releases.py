"""Release decisions across a fleet (spec §18): two real ``serve`` replicas on
one PostgreSQL, both with the same two workers (``old`` serving the stable
route, ``new`` the canary). A gate's rollback on one replica, and every
command, reach the other within 2 s; a rollback survives a restart."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.testing.harness import default_policy, write_config
from gateway.testing.simulator import Simulator
from tests.support.process import REPO, Served, serve, serving
from tests.support.redis import RedisServer
from tests.support.stack import issuers, metrics_headers

DSN_ENV = "GATEWAY_STATE_DSN"
ALIAS = "chat-model"
#: the spec's bound for a decision to reach every replica, plus one poll's slack
REACH_S = 2.0


def _route(name: str) -> str:
    return "/srv/mosaic-models/" + hashlib.sha256(name.encode()).hexdigest()


OLD, NEW = _route("chat-old"), _route("chat-new")


def _configs(root: Path, old: Simulator, new: Simulator, redis: RedisServer) -> list[Path]:
    policy = default_policy(
        "acme",
        models={ALIAS: "release:chat"},
        limits={"max_output_tokens": 512, "requests_per_minute": 60000},
    )
    release = {
        "name": "chat",
        "stable": OLD,
        "canary": NEW,
        "canary_percent": 50,
        "cohort": "request",
        "gate": {"window_s": 60, "min_requests": 5, "max_failure_rate_delta": 0.05},
    }
    return [
        write_config(
            root / f"replica{i}",
            upstream_port=0,
            policies={"acme": policy},
            issuers=issuers(),
            upstreams=[
                {"name": "old", "base_url": old.base_url, "routes": [OLD]},
                {"name": "new", "base_url": new.base_url, "routes": [NEW]},
            ],
            releases=[release],
            state={"backend": "postgres", "dsn_env": DSN_ENV, "replica_id": f"replica-{i}"},
            limits_store={"backend": "redis", "url": redis.url},
        )
        for i in range(2)
    ]


def _percent(replica: Served) -> float | None:
    try:
        text = httpx.get(replica.url + "/metrics", headers=metrics_headers(), timeout=5).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_release_canary_percent":
                return float(sample.value)
    return None


def _ready(replica: Served) -> bool:
    try:
        return httpx.get(replica.url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _until(check: Any, what: str, timeout_s: float) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - began


def _release(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.tools.cli",
            "release",
            args[0],
            "--config",
            str(config),
            *args[1:],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_decisions_reach_every_replica_within_2_s_and_survive_a_restart(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres_dsn: str,
    shared_redis: RedisServer,
) -> None:
    monkeypatch.setenv(DSN_ENV, postgres_dsn)
    old, new = Simulator(model_ids=[OLD]), Simulator(model_ids=[NEW])
    old.start()
    new.start()
    try:
        first, second = _configs(tmp_path, old, new, shared_redis)
        with serving([first, second]) as (a, b):
            for replica in (a, b):
                _until(lambda r=replica: _ready(r), "replica ready", 30)
            _until(lambda: _percent(b) == 50, "the configured percent", 10)
            # The canary fails: only replica A sees it, and its gate rolls back.
            new.set_knobs(status=500)
            headers = {"authorization": f"Bearer {a.dev_token('acme')}"}
            body = {"model": ALIAS, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
            with httpx.Client(base_url=a.url, headers=headers, timeout=20) as client:
                answers = [client.post("/v1/chat/completions", json=body) for _ in range(40)]
            _until(lambda: _percent(a) == 0, "replica A rolled back", 10)
            reached = _until(lambda: _percent(b) == 0, "the rollback on replica B", 10)
            # An operator's commands, through the store, to both replicas.
            assert _release(first, "set", "chat", "--percent", "30").returncode == 0
            set_reached = _until(lambda: _percent(b) == 30 and _percent(a) == 30, "set", 10)
            rolled = _release(first, "rollback", "chat")
            assert rolled.returncode == 0, rolled.stderr
            rollback_reached = _until(lambda: _percent(b) == 0, "rollback", 10)
        # Both replicas gone; one comes back: the rollback stands.
        with serve(second, second.parent) as again:
            _until(lambda: _ready(again), "restarted replica ready", 30)
            _until(lambda: _percent(again) is not None, "the gauge", 10)
            after_restart = _percent(again)
            cleared = _release(second, "clear", "chat")
            cleared_reached = _until(lambda: _percent(again) == 50, "clear", 10)
    finally:
        old.stop()
        new.stop()
    assert {r.status_code for r in answers} == {200}, "every caller answered (fallback)"
    assert reached <= REACH_S
    assert set_reached <= REACH_S and rollback_reached <= REACH_S
    assert after_restart == 0
    assert cleared.returncode == 0 and cleared_reached <= REACH_S
    print(
        f"\nrollback reached the other replica in {reached:.2f} s; set {set_reached:.2f} s;"
        f" rollback {rollback_reached:.2f} s; clear after a restart {cleared_reached:.2f} s"
    )
