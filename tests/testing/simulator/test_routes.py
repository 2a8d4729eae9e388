"""Several routes per simulator: ``/v1/models``, per-route statuses, routing by
``model``, the recorded ``SimRequest.model`` (findings §2, §8; spec §16)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.testing.simulator import DEFAULT_MODEL_ID, Simulator
from tests.testing.simulator.conftest import ROUTE_A, ROUTE_B
from tests.testing.simulator.wire import http_request, read_raw

CHAT = "/v1/chat/completions"


def chat(model: str, text: str = "[[sim chunks=1]]") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def listed(client: httpx.Client) -> list[tuple[str, str | None]]:
    data = client.get("/v1/models").json()["data"]
    return [(d["id"], d.get("status")) for d in data]


def test_models_lists_every_route(sim: Simulator, client: httpx.Client) -> None:
    assert sim.model_ids == (ROUTE_A, ROUTE_B) and sim.model_id == ROUTE_A
    body = client.get("/v1/models").json()
    created = body["data"][0]["created"]
    assert body["data"][2] == {
        "id": ROUTE_B,
        "object": "model",
        "created": created,
        "owned_by": "local",
        "root": ROUTE_B,
        "status": "loaded",
    }
    assert listed(client) == [("default", None), (ROUTE_A, "loaded"), (ROUTE_B, "loaded")]


def test_per_route_statuses_and_entries(sim: Simulator, client: httpx.Client) -> None:
    sim.set_status(ROUTE_B, "reloading")
    sim.set_entries(ROUTE_A, 2)
    assert listed(client) == [
        ("default", None),
        (ROUTE_A, "loaded"),
        (ROUTE_A, "loaded"),
        (ROUTE_B, "reloading"),
    ]
    sim.set_status(ROUTE_A, None)
    assert listed(client) == [("default", None), (ROUTE_B, "reloading")]
    assert sim.status(ROUTE_A) is None and sim.status(ROUTE_B) == "reloading"
    sim.set_model_status("unloaded")  # the one-route API: the default route
    assert sim.status(ROUTE_A) == "unloaded"
    with pytest.raises(ValueError, match="no such route"):
        sim.set_status("/srv/other", "loaded")
    with pytest.raises(ValueError, match="status must be"):
        sim.set_status(ROUTE_A, "sleeping")
    with pytest.raises(ValueError, match="count must be"):
        sim.set_entries(ROUTE_A, 17)
    sim.reset()
    assert listed(client) == [("default", None), (ROUTE_A, "loaded"), (ROUTE_B, "loaded")]


def test_requests_route_by_model_and_record_it(sim: Simulator, client: httpx.Client) -> None:
    assert client.post(CHAT, json=chat(ROUTE_B)).json()["model"] == ROUTE_B
    assert client.post(CHAT, json=chat("default")).json()["model"] == ROUTE_A
    no_model = {"messages": "[[sim chunks=1]]", "stream": True}
    raw = read_raw(sim.port, http_request(CHAT, no_model))
    assert f'"model":"{ROUTE_A}"'.encode() in raw.body
    completion = client.post("/v1/completions", json={"model": ROUTE_B, "prompt": "p"})
    assert completion.json()["model"] == ROUTE_B
    responses = client.post("/v1/responses", json={"model": ROUTE_B, "input": "x"})
    assert responses.json()["model"] == ROUTE_B
    client.get("/v1/models")
    assert [(r.path, r.model) for r in sim.requests()] == [
        (CHAT, ROUTE_B),
        (CHAT, "default"),
        (CHAT, "default"),  # absent: read as "default", like the real server
        ("/v1/completions", ROUTE_B),
        ("/v1/responses", ROUTE_B),
        ("/v1/models", None),
    ]


def test_unlisted_and_unloaded_routes(sim: Simulator, client: httpx.Client) -> None:
    sim.set_status(ROUTE_B, None)
    refused = client.post(CHAT, json=chat(ROUTE_B))
    assert refused.status_code == 500
    assert refused.json() == {
        "message": f"Requested model '{ROUTE_B}' is not available. Available models: "
        f"{ROUTE_A}. Use 'default' to use the default model."
    }
    assert client.post("/v1/responses", json={"model": ROUTE_B, "input": "x"}).status_code == 500
    assert client.post("/v1/embeddings", json={"model": ROUTE_B, "input": "x"}).status_code == 422
    assert client.post(CHAT, json=chat(ROUTE_A)).status_code == 200
    sim.set_status(ROUTE_A, "unloaded")
    assert client.post("/v1/embeddings", json={"model": ROUTE_A, "input": "x"}).status_code == 200
    assert sim.status(ROUTE_A) == "loaded"  # a request reloads its model, as the engine does
    sim.set_status(ROUTE_A, None)
    assert client.post(CHAT, json=chat("default")).status_code == 500  # default = first route


def test_admin_routes_act_per_route(sim: Simulator, client: httpx.Client) -> None:
    unload = client.post("/v1/models/unload", json={"model_id": ROUTE_B})
    assert unload.json() == {"model_id": ROUTE_B, "status": "unloaded"}
    assert sim.status(ROUTE_B) == "unloaded" and sim.status(ROUTE_A) == "loaded"
    status = client.post("/v1/models/status", json={"model_id": "default"}).json()
    assert status == {"model_id": "default", "status": "loaded"}
    reload = client.post("/v1/models/reload", json={"model_id": ROUTE_B}).json()
    assert reload == {"model_id": ROUTE_B, "status": "loaded"}
    sim.set_status(ROUTE_B, None)
    gone = client.post("/v1/models/status", json={"model_id": ROUTE_B}).json()
    assert gone == {"model_id": ROUTE_B, "status": "not_found"}


def test_constructor_rules() -> None:
    with pytest.raises(ValueError, match="Model ID conflict"):
        Simulator(model_ids=["a", "a"])
    with pytest.raises(ValueError, match="at least one"):
        Simulator(model_ids=[])
    with pytest.raises(ValueError, match="first of model_ids"):
        Simulator(model_id="x", model_ids=["y"])
    with pytest.raises(ValueError, match="not a usable model id"):
        Simulator(model_ids=["default"])
    assert Simulator(model_id="x", model_ids=["x", "y"]).model_ids == ("x", "y")
    assert Simulator(model_id="x").model_ids == ("x",)
    assert Simulator().model_ids == (DEFAULT_MODEL_ID,)
    with pytest.raises(ValueError, match="terminal"):
        Simulator(terminal="sometimes")
    with pytest.raises(ValueError, match="dims"):
        Simulator(dims=0)


def test_two_simulators_one_serving_two_routes() -> None:
    """The spec §16 layout: a chat worker with two routes, an embeddings worker."""
    chat_worker = Simulator(model_ids=[ROUTE_A, ROUTE_B])
    embed_worker = Simulator(model_id="/srv/mosaic-models/embed")
    chat_worker.start()
    embed_worker.start()
    try:
        with httpx.Client(timeout=5) as c:
            assert c.post(chat_worker.base_url + CHAT, json=chat(ROUTE_B)).status_code == 200
            url = embed_worker.base_url + "/v1/embeddings"
            assert c.post(url, json={"model": ROUTE_B, "input": "x"}).status_code == 422
            ok = c.post(url, json={"model": "/srv/mosaic-models/embed", "input": "x"})
            assert ok.status_code == 200
    finally:
        chat_worker.stop()
        embed_worker.stop()
    assert [r.model for r in chat_worker.requests()] == [ROUTE_B]
    assert [r.model for r in embed_worker.requests()] == [ROUTE_B, "/srv/mosaic-models/embed"]
