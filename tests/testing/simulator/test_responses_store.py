"""The Responses store: GET / DELETE / cancel, ``store``, streamed runs kept
only as history, ``previous_response_id``, background runs (findings §5d-§5e)."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.testing.simulator import Simulator
from tests.testing.simulator.wire import http_request, read_raw, sse_events

RESPONSES = "/v1/responses"
# "sim-token-0 sim-token-1 " (24 characters) is 6 tokens, plus 4 for its message.
TWO_TOKENS_OF_HISTORY = 10


def run(client: httpx.Client, text: str = "[[sim chunks=2]]", **extra: Any) -> dict[str, Any]:
    response = client.post(RESPONSES, json={"input": text, **extra})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def not_found(response_id: str) -> dict[str, str]:
    return {"message": f"Response with ID '{response_id}' not found"}


def test_stored_non_stream_get_and_delete(sim: Simulator, client: httpx.Client) -> None:
    resource = run(client)
    rid = resource["id"]
    got = client.get(f"{RESPONSES}/{rid}")
    assert got.status_code == 200 and got.json() == resource
    assert sim.stored_response(rid) == resource and sim.has_history(rid)
    deleted = client.delete(f"{RESPONSES}/{rid}")
    assert deleted.status_code == 200
    assert list(deleted.json()) == ["deleted", "id", "object"]
    assert deleted.json() == {"deleted": True, "id": rid, "object": "response.deleted"}
    again = client.get(f"{RESPONSES}/{rid}")
    assert (again.status_code, again.json()) == (404, not_found(rid))
    gone = client.delete(f"{RESPONSES}/{rid}")
    assert (gone.status_code, gone.json()) == (404, not_found(rid))


def test_store_false_keeps_nothing(sim: Simulator, client: httpx.Client) -> None:
    rid = run(client, store=False)["id"]
    assert client.get(f"{RESPONSES}/{rid}").status_code == 404
    assert client.delete(f"{RESPONSES}/{rid}").status_code == 404
    assert not sim.has_history(rid)
    first = run(client, "[[sim chunks=1]]")["usage"]["input_tokens"]
    assert run(client, "[[sim chunks=1]]", previous_response_id=rid)["usage"]["input_tokens"] == (
        first
    )


def test_streamed_run_is_history_only(sim: Simulator, client: httpx.Client) -> None:
    body = {"input": "[[sim chunks=2]]", "stream": True}
    raw = read_raw(sim.port, http_request(RESPONSES, body))
    rid = sse_events(raw.body)[0].json()["response"]["id"]
    prompt = sse_events(raw.body)[-2].json()["response"]["usage"]["input_tokens"]
    assert client.get(f"{RESPONSES}/{rid}").status_code == 404
    assert sim.has_history(rid)
    follow = {"input": "[[sim chunks=1]]", "previous_response_id": rid}
    alone = run(client, "[[sim chunks=1]]")["usage"]["input_tokens"]
    after = run(client, **follow)["usage"]["input_tokens"]
    assert after == alone + prompt + TWO_TOKENS_OF_HISTORY
    assert client.delete(f"{RESPONSES}/{rid}").status_code == 200  # the history entry
    assert client.delete(f"{RESPONSES}/{rid}").status_code == 404
    assert run(client, **follow)["usage"]["input_tokens"] == alone  # deleted: ignored


def test_previous_response_id_chains_and_unknown_ids_are_ignored(client: httpx.Client) -> None:
    first = run(client)
    alone = run(client, "[[sim chunks=1]]")["usage"]["input_tokens"]
    unknown = run(client, "[[sim chunks=1]]", previous_response_id="resp_nope")
    assert unknown["usage"]["input_tokens"] == alone
    assert "previous_response_id" not in unknown  # not echoed
    second = run(client, "[[sim chunks=1]]", previous_response_id=first["id"])
    expected = alone + first["usage"]["input_tokens"] + TWO_TOKENS_OF_HISTORY
    assert second["usage"]["input_tokens"] == expected
    # the chain goes on: the second's history holds the first's
    third = run(client, "[[sim chunks=1]]", previous_response_id=second["id"])
    assert third["usage"]["input_tokens"] > second["usage"]["input_tokens"]


def test_streamed_history_needs_done(sim: Simulator) -> None:
    sim.reset()
    body = {"input": "[[sim chunks=2 fault=missing_done]]", "stream": True}
    raw = read_raw(sim.port, http_request(RESPONSES, body))
    rid = sse_events(raw.body)[0].json()["response"]["id"]
    assert not sim.has_history(rid)
    no_store = {"input": "[[sim chunks=1]]", "stream": True, "store": False}
    raw = read_raw(sim.port, http_request(RESPONSES, no_store))
    assert not sim.has_history(sse_events(raw.body)[0].json()["response"]["id"])


def test_routes_of_the_store(client: httpx.Client) -> None:
    assert client.post(f"{RESPONSES}/resp_x").status_code == 405
    assert client.get(f"{RESPONSES}/resp_x/cancel").status_code == 405
    assert client.get(f"{RESPONSES}/resp_x/other").status_code == 404
    assert client.get(f"{RESPONSES}/").status_code == 404
    cancel = client.post(f"{RESPONSES}/resp_x/cancel")
    assert cancel.status_code == 404
    message = "Response with ID 'resp_x' not found or cannot be cancelled"
    assert cancel.json() == {"message": message}


def test_reset_empties_the_store(sim: Simulator, client: httpx.Client) -> None:
    rid = run(client)["id"]
    sim.reset()
    assert client.get(f"{RESPONSES}/{rid}").status_code == 404


# --------------------------------------------------------------- background


def test_background_answers_queued_then_completes(sim: Simulator, client: httpx.Client) -> None:
    text = "[[sim chunks=4 delay_ms=100]]"
    queued = client.post(
        RESPONSES, json={"input": text, "background": True, "stream": True, "metadata": {"a": 1}}
    )
    assert queued.status_code == 200
    body = queued.json()
    assert body == {
        "id": body["id"],
        "object": "response",
        "created_at": body["created_at"],
        "model": "default",
        "status": "queued",
        "output": [],
        "metadata": {"a": 1},
    }
    rid = body["id"]
    running = client.get(f"{RESPONSES}/{rid}").json()
    assert running["status"] == "in_progress" and running["output"] == []
    assert "metadata" not in running
    assert sim.wait_for(
        lambda: (sim.stored_response(rid) or {}).get("status") == "completed", timeout=5
    )
    done = client.get(f"{RESPONSES}/{rid}").json()
    assert done["output_text"] == "sim-token-0 sim-token-1 sim-token-2 sim-token-3 "
    assert done["background"] is True and done["metadata"] == {"a": 1}
    assert sim.has_history(rid)
    (request,) = [r for r in sim.requests() if r.method == "POST"]
    assert request.completed


def test_background_cancel_only_relabels(sim: Simulator, client: httpx.Client) -> None:
    rid = run(client, "[[sim chunks=3 delay_ms=100]]", background=True)["id"]
    cancelled = client.post(f"{RESPONSES}/{rid}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert client.get(f"{RESPONSES}/{rid}").json()["status"] == "cancelled"
    # generation was not stopped: completion overwrites the label
    assert sim.wait_for(
        lambda: (sim.stored_response(rid) or {}).get("status") == "completed", timeout=5
    )
    assert client.post(f"{RESPONSES}/{rid}/cancel").status_code == 404


def test_background_store_false_and_failed(sim: Simulator, client: httpx.Client) -> None:
    kept = run(client, "[[sim chunks=1]]", background=True, store=False)["id"]
    assert sim.wait_for(lambda: (sim.stored_response(kept) or {}).get("status") == "completed", 5)
    assert not sim.has_history(kept)  # the task keeps the result; the cache does not
    failed = run(client, "[[sim chunks=1 terminal=failed]]", background=True)["id"]
    assert sim.wait_for(lambda: (sim.stored_response(failed) or {}).get("status") == "failed", 5)
    resource = client.get(f"{RESPONSES}/{failed}").json()
    assert resource["error"] == {"type": "model_error", "message": "simulated model error"}
    assert client.delete(f"{RESPONSES}/{failed}").status_code == 200
    assert client.get(f"{RESPONSES}/{failed}").status_code == 404
