"""Caller approvals through the real gateway (spec §22 "Asking the caller"):
``POST /v1/agent/approvals/{id}`` decides an approval the stream's replica
opened (here through the running gateway's own book, as the agentic stream
does) and wakes that stream at once; the body, the tenant and a second
decision are checked; nothing reaches a worker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from gateway.apis.agents.frames import new_approval_id
from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack, worker_posts

T = TypeVar("T")
ENDPOINTS = ["chat.completions", "messages", "models"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    policy = {"endpoints": ENDPOINTS}
    try:
        with running_stack(tmp_path_factory.mktemp("approvals"), acme=policy, globex=policy) as s:
            yield s
    finally:
        mp.undo()


def submit(stack: Stack, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    loop = stack.gw.server.server.servers[0].get_loop()
    return asyncio.run_coroutine_threadsafe(coro, loop)


def opened(stack: Stack, tenant: str = "acme") -> str:
    """An approval as the stream's replica opens it (its id is the gateway's)."""
    approval_id = new_approval_id()
    submit(stack, stack.runtime.approvals.open(tenant, "req_" + "0" * 32, approval_id)).result(10)
    return approval_id


def decide(stack: Stack, approval_id: str, body: Any, tenant: str = "acme") -> httpx.Response:
    with stack.client(stack.rs256(tenant=tenant)) as c:
        return c.post(f"/v1/agent/approvals/{approval_id}", json=body)


def error(response: httpx.Response) -> tuple[int, str, str | None]:
    e = response.json()["error"]
    return response.status_code, e["code"], e["param"]


def test_a_decision_wakes_the_waiting_stream_at_once_and_only_once(stack: Stack) -> None:
    approvals = stack.runtime.approvals
    approval = opened(stack)
    waiting = submit(stack, approvals.wait(approval, 10))
    began = time.monotonic()
    answer = decide(stack, approval, {"decision": "approve"})
    assert (answer.status_code, answer.json()) == (200, {"status": "resolved"})
    assert waiting.result(5) == "approve"
    # The HTTP round trip included: the stream knows well within the spec's second.
    assert time.monotonic() - began < 1.0
    again = decide(stack, approval, {"decision": "deny"})
    assert error(again) == (409, "approval_resolved", None)
    submit(stack, approvals.close(approval)).result(10)
    closed = decide(stack, approval, {"decision": "approve"})
    assert error(closed) == (404, "approval_not_found", None)
    assert worker_posts(stack.sim) == []


def test_another_tenant_can_never_decide_and_learns_nothing(stack: Stack) -> None:
    approvals = stack.runtime.approvals
    approval = opened(stack)
    foreign = decide(stack, approval, {"decision": "approve"}, tenant="globex")
    unknown = decide(stack, new_approval_id(), {"decision": "approve"}, tenant="globex")
    assert error(foreign) == error(unknown) == (404, "approval_not_found", None)
    assert foreign.text == unknown.text
    assert submit(stack, approvals.wait(approval, 0.3)).result(5) is None  # still pending
    assert decide(stack, approval, {"decision": "deny"}).status_code == 200
    assert submit(stack, approvals.wait(approval, 5)).result(10) == "deny"
    submit(stack, approvals.close(approval)).result(10)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"decision": "approve", "remember_for_session": True},
            (400, "unsupported_field", "remember_for_session"),
        ),
        (
            {"decision": "approve", "remember_for_session": False},
            (400, "unsupported_field", "remember_for_session"),
        ),
        ({"decision": "deny", "message": "no"}, (400, "unsupported_field", "message")),
        ({"decision": "maybe"}, (400, "invalid_request", "decision")),
        ({"decision": True}, (400, "invalid_request", "decision")),
        ({"decision": "APPROVE"}, (400, "invalid_request", "decision")),
        ({}, (400, "invalid_request", "decision")),
        ([{"decision": "approve"}], (400, "invalid_request", None)),
        ("approve", (400, "invalid_request", None)),
    ],
)
def test_a_body_is_exactly_one_decision(
    stack: Stack, body: Any, expected: tuple[int, str, str | None]
) -> None:
    approval = opened(stack)
    assert error(decide(stack, approval, body)) == expected
    # Refused bodies decided nothing: the approval still takes a decision.
    assert decide(stack, approval, {"decision": "deny"}).status_code == 200


def test_an_explicit_null_is_an_absent_field(stack: Stack) -> None:
    approval = opened(stack)
    body = {"decision": "approve", "remember_for_session": None, "message": None}
    assert decide(stack, approval, body).status_code == 200


def test_malformed_bodies_and_ids(stack: Stack) -> None:
    approval = opened(stack)
    with stack.client() as c:
        path = f"/v1/agent/approvals/{approval}"
        bad_json = c.post(path, content=b"{decision", headers={"content-type": "application/json"})
        assert error(bad_json) == (400, "invalid_json", None)
        huge = c.post(path, json={"decision": "approve", "pad": "x" * 5000})
        assert error(huge) == (413, "body_too_large", None)
        for wrong in ("x", "apr_" + "0" * 31, "APR_" + "0" * 32, approval + "0"):
            assert error(c.post(f"/v1/agent/approvals/{wrong}", json={"decision": "approve"})) == (
                404,
                "approval_not_found",
                None,
            )
        assert error(c.get(path)) == (405, "method_not_allowed", None)
        assert error(c.post("/v1/agent/approvals", json={})) == (404, "not_found", None)
    assert decide(stack, approval, {"decision": "approve"}).status_code == 200


def test_deciding_needs_credentials_inference_and_an_agentic_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEMO_SECRET_ENV, HS_SECRET)
    with running_stack(
        tmp_path, acme={"endpoints": ["messages"]}, globex={"endpoints": ["models"]}
    ) as s:
        approval = opened(s)
        path = s.url + f"/v1/agent/approvals/{approval}"
        body = {"decision": "approve"}
        assert error(httpx.post(path, json=body)) == (401, "missing_credentials", None)
        with s.client(s.rs256(scope="evidence")) as c:
            assert error(c.post(path, json=body)) == (403, "insufficient_scope", None)
        with s.client(s.rs256(tenant="globex")) as c:
            assert error(c.post(path, json=body)) == (403, "endpoint_not_allowed", None)
        # messages is an endpoint agentic streams run on: enough without chat.
        with s.client(s.rs256()) as c:
            assert c.post(path, json=body).status_code == 200
