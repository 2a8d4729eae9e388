"""Operability on a threaded stack: readiness, probes and metrics (spec §5, §10, §11).

The gateway polls the simulator's ``GET /v1/models`` every 0.2 s (the
harness's ``upstream.readiness_poll_s``); every readiness change must show on
``/readyz`` and on ``gateway_upstream_ready`` within two poll intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from hashlib import sha256
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.testing.harness import SIM_ROUTE
from gateway.testing.simulator import Simulator
from tests.support.poll import eventually
from tests.support.stack import (
    API_KEY,
    API_KEY_SHA,
    Stack,
    chat_body,
    metrics_headers,
    running_stack,
    sse_data,
    worker_posts,
)

POLL_S = 0.2
#: two poll intervals, plus a little for the poll itself and thread scheduling
WITHIN_S = 2 * POLL_S + 0.3

SPEC_METRICS = (
    "gateway_requests_total",
    "gateway_request_duration_seconds",
    "gateway_ttft_seconds",
    "gateway_stream_outcomes_total",
    "gateway_tokens_total",
    "gateway_permits_in_use",
    "gateway_admission_queue_depth",
    "gateway_admission_wait_seconds",
    "gateway_upstream_ready",
    "gateway_evidence_leases_active",
    "gateway_reloads_total",
)

Sample = tuple[str, dict[str, str], float]


@pytest.fixture
def ops_stack(tmp_path: Path, _dev_secret: None) -> Iterator[Stack]:
    with running_stack(tmp_path, upstream={"readiness_poll_s": POLL_S}) as running:
        yield running


def samples(client: httpx.Client) -> list[Sample]:
    response = client.get("/metrics", headers=metrics_headers())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    ]


def sample_value(found: list[Sample], name: str, **labels: str) -> float | None:
    for sample_name, sample_labels, value in found:
        if sample_name == name and sample_labels == labels:
            return value
    return None


def readyz_turns(client: httpx.Client, status: int) -> bool:
    """Whether ``/readyz`` answers ``status`` within two readiness polls."""
    return eventually(lambda: client.get("/readyz").status_code == status, WITHIN_S)


def _reloading(sim: Simulator) -> None:
    sim.set_model_status("reloading")


def _unloaded(sim: Simulator) -> None:
    sim.set_model_status("unloaded")


def _missing(sim: Simulator) -> None:
    sim.set_model_status(None)


def _duplicated(sim: Simulator) -> None:
    sim.set_model_entries(2)


def _bad_body(sim: Simulator) -> None:
    sim.set_models_fault("bad_body")


def _restore(sim: Simulator) -> None:
    sim.set_model_status("loaded")
    sim.set_model_entries(1)
    sim.set_models_fault(None)


@pytest.mark.parametrize(
    ("break_worker", "reason"),
    [
        (_reloading, "reloading"),
        (_unloaded, "unloaded"),
        (_missing, "route_missing"),
        (_duplicated, "duplicate_route"),
        (_bad_body, "bad_body"),
    ],
    ids=["reloading", "unloaded", "missing", "duplicated", "bad_body"],
)
def test_readiness_follows_the_worker(
    ops_stack: Stack, break_worker: Callable[[Simulator], None], reason: str
) -> None:
    stack = ops_stack
    route = {"upstream": "default", "route": SIM_ROUTE}
    with stack.client() as client:
        assert client.get("/readyz").status_code == 200
        assert sample_value(samples(client), "gateway_upstream_ready", **route) == 1.0

        break_worker(stack.sim)
        assert readyz_turns(client, 503)
        assert client.get("/readyz").json() == {
            "status": "not_ready",
            "routes": {SIM_ROUTE: {"upstream": "default", "ready": False, "reason": reason}},
            "draining": False,
        }
        assert sample_value(samples(client), "gateway_upstream_ready", **route) == 0.0

        before = len(worker_posts(stack.sim))
        refused = client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "upstream_not_ready"
        assert len(worker_posts(stack.sim)) == before
        receipt = stack.receipt(refused.headers["x-request-id"])
        assert (receipt["outcome"], receipt["error_code"]) == ("rejected", "upstream_not_ready")
        assert receipt["request_sha256"] is None

        _restore(stack.sim)
        assert readyz_turns(client, 200)
        assert stack.runtime.readiness.state(SIM_ROUTE).status == "loaded"
        assert sample_value(samples(client), "gateway_upstream_ready", **route) == 1.0
        served = client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert served.status_code == 200
        assert sse_data(served.text)[-1] == "[DONE]"


def test_livez_stays_up_without_the_worker(ops_stack: Stack) -> None:
    stack = ops_stack
    stack.sim.stop()
    with stack.client() as client:
        assert client.get("/livez").status_code == 200
        assert readyz_turns(client, 503)
        assert client.get("/livez").json() == {"status": "ok"}
        refused = client.post("/v1/chat/completions", json=chat_body())
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "upstream_not_ready"
        ready = sample_value(
            samples(client), "gateway_upstream_ready", upstream="default", route=SIM_ROUTE
        )
        assert ready == 0.0
        assert client.get("/readyz").json()["routes"][SIM_ROUTE]["reason"] == "connection_refused"


def test_every_spec_metric_is_exposed(ops_stack: Stack) -> None:
    stack = ops_stack
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert response.status_code == 200
        stack.receipt(response.headers["x-request-id"])
        found = samples(client)
    names = {name for name, _, _ in found}
    missing = [
        metric
        for metric in SPEC_METRICS
        if not any(name == metric or name.startswith(metric + "_") for name in names)
    ]
    assert missing == []
    ok = {"tenant": "acme", "endpoint": "chat.completions", "status": "200"}
    assert sample_value(found, "gateway_requests_total", **ok) == 1.0
    assert sample_value(found, "gateway_stream_outcomes_total", tenant="acme", outcome="complete")
    assert sample_value(
        found, "gateway_tokens_total", tenant="acme", kind="completion", source="reported"
    )
    assert sample_value(found, "gateway_ttft_seconds_count") == 1.0
    assert sample_value(
        found, "gateway_request_duration_seconds_count", endpoint="chat.completions"
    )
    assert sample_value(found, "gateway_admission_wait_seconds_count") == 1.0
    assert sample_value(found, "gateway_permits_in_use", upstream="default") == 0.0
    assert sample_value(found, "gateway_admission_queue_depth", upstream="default") == 0.0
    assert sample_value(found, "gateway_evidence_leases_active") == 0.0
    assert sample_value(found, "gateway_reloads_total", result="applied") == 0.0
    assert sample_value(found, "gateway_reloads_total", result="refused") == 0.0


def test_tenant_labels_come_only_from_config(ops_stack: Stack) -> None:
    stack = ops_stack
    stranger = "stranger-tenant-7f3a"
    with httpx.Client(base_url=stack.url) as client:
        anonymous = client.post("/v1/chat/completions", json=chat_body())
        assert anonymous.status_code == 401
        unconfigured = client.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers=stack.headers(stack.rs256(tenant=stranger)),
        )
        assert unconfigured.status_code == 403
        assert unconfigured.json()["error"]["code"] == "tenant_not_configured"
        served = client.post("/v1/chat/completions", json=chat_body(), headers=stack.headers())
        assert served.status_code == 200
        text = client.get("/metrics", headers=metrics_headers()).text
        found = samples(client)
    unauthenticated = {"tenant": "-", "endpoint": "chat.completions", "status": "401"}
    assert sample_value(found, "gateway_requests_total", **unauthenticated) == 1.0
    refused = {"tenant": "-", "endpoint": "chat.completions", "status": "403"}
    assert sample_value(found, "gateway_requests_total", **refused) == 1.0
    assert stranger not in text
    # Every refusal is counted once, from any route, by code.
    missing = {"tenant": "-", "code": "missing_credentials"}
    assert sample_value(found, "gateway_rejections_total", **missing) == 1.0
    unknown = {"tenant": "-", "code": "tenant_not_configured"}
    assert sample_value(found, "gateway_rejections_total", **unknown) == 1.0
    tenants = {labels["tenant"] for _, labels, _ in found if "tenant" in labels}
    assert tenants <= {"acme", "globex", "-"}
    assert "acme" in tenants


# -- /metrics on the callers' port (spec §24) ----------------------------------------

SCRAPER_KEY = "sk-test-acme-scraper-000000000000000000000"


def test_metrics_on_the_callers_port_need_the_metrics_scope(tmp_path: Path) -> None:
    scraper = {"name": "scraper", "sha256": sha256(SCRAPER_KEY.encode()).hexdigest()}
    keys = [
        {"name": "nightly", "sha256": API_KEY_SHA},  # no scopes listed: inference, evidence
        {**scraper, "scopes": ["metrics"]},
    ]
    with running_stack(tmp_path, acme={"api_keys": keys}) as stack, stack.client() as client:
        missing = httpx.get(f"{stack.url}/metrics", timeout=5)
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "missing_credentials"
        assert "gateway_requests_total" not in missing.text
        for token in (stack.rs256(), API_KEY):  # inference and evidence only
            refused = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "insufficient_scope"
        for token in (stack.rs256(scope="metrics"), SCRAPER_KEY):
            scraped = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
            assert scraped.status_code == 200 and "gateway_requests_total" in scraped.text
        # The scraper's key is for scraping only.
        chat = client.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers={"authorization": f"Bearer {SCRAPER_KEY}"},
        )
        assert chat.status_code == 403 and chat.json()["error"]["code"] == "insufficient_scope"
