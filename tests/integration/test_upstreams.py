"""Several workers and models behind one gateway (spec §16): two simulators, one
serving two routes, each alias reaching exactly its worker and route."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.testing.harness import Gateway, default_policy, write_config
from gateway.testing.simulator import Simulator
from gateway.tools import cli
from tests.support.jwt import make_claims, sign_rs256
from tests.support.poll import eventually
from tests.support.stack import chat_body, issuers, sse_data, worker_posts


def _route(name: str) -> str:
    return "/srv/mosaic-models/" + hashlib.sha256(name.encode()).hexdigest()


CHAT, VISION, EMBED = _route("chat"), _route("vision"), _route("embed")
ALIASES = {"chat-model": CHAT, "vision-model": VISION, "embed-model": EMBED}
ENDPOINTS = ["chat.completions", "completions", "responses", "embeddings", "models", "evidence"]


class Pod:
    def __init__(self, directory: Path, gpu: Simulator, cpu: Simulator, gateway: Gateway) -> None:
        self.dir, self.gpu, self.cpu, self.gw = directory, gpu, cpu, gateway

    @property
    def url(self) -> str:
        return self.gw.base_url

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {sign_rs256(make_claims(tenant='acme'))}"}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=10, **kwargs)

    def receipt(self, request_id: str) -> dict[str, Any]:
        from gateway.testing.harness import wait_receipt

        return wait_receipt(self.gw.runtime.config.audit.path, request_id)

    def reload(self) -> list[str]:
        loop = self.gw.server.server.servers[0].get_loop()
        future = asyncio.run_coroutine_threadsafe(self.gw.runtime.reload(), loop)
        errors: list[str] = future.result(10)
        return errors


def _upstreams(
    gpu: Simulator, cpu: Simulator, gpu_extra: dict[str, Any], cpu_extra: dict[str, Any]
) -> list[dict[str, Any]]:
    return [
        {
            "name": "gpu",
            "base_url": gpu.base_url,
            "routes": [CHAT, VISION],
            "capacity": 2,
            **gpu_extra,
        },
        {"name": "cpu", "base_url": cpu.base_url, "routes": [EMBED], "capacity": 3, **cpu_extra},
    ]


@contextmanager
def pod(
    tmp_path: Path,
    models: dict[str, str] | None = None,
    gpu_extra: dict[str, Any] | None = None,
    cpu_extra: dict[str, Any] | None = None,
) -> Iterator[Pod]:
    gpu = Simulator(model_ids=[CHAT, VISION])
    cpu = Simulator(model_ids=[EMBED])
    gpu.start()
    cpu.start()
    try:
        policy = default_policy("acme", models=models or dict(ALIASES), endpoints=ENDPOINTS)
        policy["admission"] = {"share": 1, "max_permits": 8, "queue_timeout_s": 30}
        config = write_config(
            tmp_path,
            upstream_port=0,
            policies={"acme": policy},
            issuers=issuers(),
            upstreams=_upstreams(gpu, cpu, gpu_extra or {}, cpu_extra or {}),
        )
        with Gateway(config) as gateway:
            running = Pod(tmp_path, gpu, cpu, gateway)
            assert gateway.wait_ready(), "the gateway never saw both workers ready"
            yield running
    finally:
        gpu.stop()
        cpu.stop()


def test_each_alias_reaches_exactly_its_worker_and_route(tmp_path: Path) -> None:
    with pod(tmp_path) as p, p.client() as client:
        for alias in ("chat-model", "vision-model"):
            response = client.post("/v1/chat/completions", json=chat_body(model=alias))
            assert response.status_code == 200 and response.json()["model"] == alias
            receipt = p.receipt(response.headers["x-request-id"])
            assert (receipt["upstream"], receipt["route"]) == ("gpu", ALIASES[alias])
        embedded = client.post("/v1/embeddings", json={"model": "embed-model", "input": "x"})
        assert embedded.status_code == 200
        assert p.receipt(embedded.headers["x-request-id"])["upstream"] == "cpu"
    assert [r.model for r in worker_posts(p.gpu)] == [CHAT, VISION]
    assert [r.model for r in worker_posts(p.cpu)] == [EMBED]


def test_a_worker_down_takes_out_only_its_routes(tmp_path: Path) -> None:
    with pod(tmp_path) as p, p.client() as client:
        p.cpu.stop()
        assert eventually(lambda: client.get("/readyz").status_code == 503, 5)
        ready = client.get("/readyz").json()
        assert ready["routes"][EMBED] == {
            "upstream": "cpu",
            "ready": False,
            "reason": "connection_refused",
        }
        assert ready["routes"][CHAT]["ready"] and ready["routes"][VISION]["ready"]
        refused = client.post("/v1/embeddings", json={"model": "embed-model", "input": "x"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (503, "upstream_not_ready")
        served = client.post("/v1/chat/completions", json=chat_body(model="chat-model"))
        assert served.status_code == 200
        models = {m["id"]: m["status"] for m in client.get("/v1/models").json()["data"]}
        assert models == {
            "chat-model": "loaded",
            "vision-model": "loaded",
            "embed-model": "unavailable",
        }


def test_capacity_holds_per_upstream(tmp_path: Path) -> None:
    with pod(tmp_path) as p:
        slow = "hold [[sim chunks=20 delay_ms=20]]"

        def stream(alias: str) -> int:
            with httpx.Client(base_url=p.url, headers=p.headers(), timeout=30) as client:
                body = chat_body(slow, model=alias, stream=True)
                return client.post("/v1/chat/completions", json=body).status_code

        threads: list[threading.Thread] = []
        results: list[int] = []
        for n in range(10):
            alias = "chat-model" if n % 2 else "vision-model"
            threads.append(threading.Thread(target=lambda a=alias: results.append(stream(a))))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert results == [200] * 10
        # Both routes of the gpu worker share its two permits.
        assert 1 <= p.gpu.max_active_streams <= 2
        # Each permit goes back in its stream's finally, which may run just after
        # the caller has read the last byte.
        assert eventually(lambda: p.gw.runtime.table.admissions.in_use == 0, 5)


def test_a_failing_probe_keeps_the_route_out_until_it_passes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.readiness")
    probe = {"probe": {"max_tokens": 1, "timeout_s": 2}}
    with pod(tmp_path, gpu_extra=probe) as p, p.client() as client:
        assert client.get("/readyz").json()["routes"][CHAT]["ready"]
        probes = [r for r in worker_posts(p.gpu) if "ping" in json.dumps(r.json)]
        assert {r.model for r in probes} == {CHAT, VISION}, "one probe per route on start"
        # The worker reloads its model and comes back broken: the probe fails.
        p.gpu.set_knobs(fault="bad_usage")
        p.gpu.set_status(CHAT, "reloading")
        assert eventually(
            lambda: client.get("/readyz").json()["routes"][CHAT]["reason"] == "reloading", 5
        )
        p.gpu.set_status(CHAT, "loaded")
        assert eventually(
            lambda: client.get("/readyz").json()["routes"][CHAT]["reason"] == "probe_failed", 5
        )
        before = len(worker_posts(p.gpu))
        refused = client.post("/v1/chat/completions", json=chat_body(model="chat-model"))
        assert refused.json()["error"]["code"] == "upstream_not_ready"
        assert [r for r in worker_posts(p.gpu)[before:] if "ping" not in json.dumps(r.json)] == []
        assert client.get("/readyz").json()["routes"][VISION]["ready"], "the other route serves"
        p.gpu.set_knobs(fault=None)
        assert eventually(lambda: client.get("/readyz").json()["routes"][CHAT]["ready"], 5)
        assert (
            client.post("/v1/chat/completions", json=chat_body(model="chat-model")).status_code
            == 200
        )
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.readiness"]
    assert any(f"route {CHAT} on upstream gpu: not ready: reloading" in m for m in logged)
    assert any(f"route {CHAT} on upstream gpu: not ready: probe_failed" in m for m in logged)
    assert sum(f"route {CHAT} on upstream gpu: ready" in m for m in logged) >= 2


def test_a_reload_moves_an_alias_for_new_requests_only(tmp_path: Path) -> None:
    with pod(tmp_path, models={"moving": CHAT, "embed-model": EMBED}) as p:
        slow = chat_body("long [[sim chunks=30 delay_ms=30]]", model="moving", stream=True)
        with httpx.Client(base_url=p.url, headers=p.headers(), timeout=30) as client:
            with client.stream("POST", "/v1/chat/completions", json=slow) as running:
                assert running.status_code == 200
                path = p.dir / "policies" / "acme.yaml"
                policy = yaml.safe_load(path.read_text())
                policy["models"]["moving"] = VISION
                path.write_text(yaml.safe_dump(policy))
                assert p.reload() == []
                moved = client.post("/v1/chat/completions", json=chat_body(model="moving"))
                assert moved.status_code == 200
                body = running.read()
            assert sse_data(body.decode())[-1] == "[DONE]"
        assert p.receipt(running.headers["x-request-id"])["route"] == CHAT
        assert p.receipt(moved.headers["x-request-id"])["route"] == VISION
        assert [r.model for r in worker_posts(p.gpu)] == [CHAT, VISION]


def test_launch_plan_per_upstream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle_a, bundle_b = "aa" * 32, "bb" * 32
    config = {
        "upstreams": [
            {
                "name": "gpu",
                "base_url": "http://127.0.0.1:1234",
                "routes": [f"/srv/m/{bundle_a}", f"/srv/m/{bundle_b}"],
                "launch": {
                    "version": "0.9.2",
                    "binary_sha256": "12" * 32,
                    "port": 1234,
                    "models": [
                        {
                            "model_public_id": "org/chat",
                            "model_revision": "r1",
                            "model_bundle_sha256": bundle_a,
                            "model_dir": f"/srv/m/{bundle_a}",
                        },
                        {
                            "model_public_id": "org/q",
                            "model_revision": "r2",
                            "model_bundle_sha256": bundle_b,
                            "model_dir": f"/srv/m/{bundle_b}",
                            "format": "gguf",
                            "quantized_file": "q4.gguf",
                        },
                    ],
                },
            },
            {
                "name": "cpu",
                "base_url": "http://127.0.0.1:1235",
                "routes": [f"/srv/m/{'cc' * 32}"],
                "launch": {
                    "version": "0.9.2",
                    "binary_sha256": "34" * 32,
                    "port": 1235,
                    "model_public_id": "org/embed",
                    "model_revision": "r3",
                    "model_bundle_sha256": "cc" * 32,
                    "model_dir": f"/srv/m/{'cc' * 32}",
                },
            },
        ]
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["launch-plan", "--config", str(path)]) == 0
    plans = json.loads(capsys.readouterr().out)["upstreams"]
    assert set(plans) == {"gpu", "cpu"}
    assert plans["gpu"]["argv"] == ["mistralrs", "from-config", "-f", "/etc/mistralrs/models.toml"]
    import tomllib

    toml = tomllib.loads(plans["gpu"]["from_config_toml"])
    assert toml["server"] == {
        "host": "127.0.0.1",
        "port": 1234,
        "no_ui": True,
        "access_log_format": "json",
    }
    assert [m["model_id"] for m in toml["models"]] == [f"/srv/m/{bundle_a}", f"/srv/m/{bundle_b}"]
    assert toml["models"][1]["format"] == {"format": "gguf", "quantized_file": "q4.gguf"}
    assert plans["cpu"]["argv"][:2] == ["mistralrs", "serve"]
    assert len({plans["gpu"]["serve_identity"], plans["cpu"]["serve_identity"]}) == 2
