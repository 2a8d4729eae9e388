"""``POST /v1/embeddings``: shapes, encodings, refusals and faults (findings §6)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import struct
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.testing.simulator import EMBEDDINGS_FAULTS, Simulator
from tests.testing.simulator.conftest import ROUTE_A, ROUTE_B
from tests.testing.simulator.wire import Raw, http_request, read_raw

EMBEDDINGS = "/v1/embeddings"


def expected_vector(key: bytes, dims: int = 8) -> list[float]:
    """The documented rule: k/128 from SHAKE-256 of the input."""
    return [(b - 128) / 128 for b in hashlib.shake_256(key).digest(dims)]


def test_body_bytes_and_key_order(sim: Simulator) -> None:
    sim.reset()
    body = {"model": ROUTE_B, "input": ["abcd", "abcdefgh"]}
    raw = read_raw(sim.port, http_request(EMBEDDINGS, body))
    assert raw.status == 200 and raw.header("content-type") == "application/json"
    expected = {
        "object": "list",
        "data": [
            {"object": "embedding", "embedding": expected_vector(b"abcd"), "index": 0},
            {"object": "embedding", "embedding": expected_vector(b"abcdefgh"), "index": 1},
        ],
        "model": ROUTE_B,
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    assert raw.body == json.dumps(expected, separators=(",", ":")).encode()
    (request,) = sim.requests()
    assert request.model == ROUTE_B and request.completed


def test_input_forms(client: httpx.Client) -> None:
    one = client.post(EMBEDDINGS, json={"input": "abcd"}).json()
    assert one["model"] == "default" and len(one["data"]) == 1
    listed = client.post(EMBEDDINGS, json={"input": ["abcd"]}).json()
    assert listed["data"] == one["data"]
    tokens = client.post(EMBEDDINGS, json={"input": [1, 2, 3]}).json()
    key = b"tokens:" + struct.pack("<3I", 1, 2, 3)
    assert tokens["data"][0]["embedding"] == expected_vector(key)
    assert tokens["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    batch = client.post(EMBEDDINGS, json={"input": [[1, 2, 3], [7]], "model": ROUTE_A}).json()
    assert [d["index"] for d in batch["data"]] == [0, 1]
    assert batch["data"][0]["embedding"] == tokens["data"][0]["embedding"]
    assert batch["usage"]["prompt_tokens"] == 4 and batch["model"] == ROUTE_A


def test_base64_is_little_endian_f32(client: httpx.Client) -> None:
    floats = client.post(EMBEDDINGS, json={"input": "x [[sim dims=5]]"}).json()
    encoded = client.post(
        EMBEDDINGS, json={"input": "x [[sim dims=5]]", "encoding_format": "base64"}
    ).json()
    text = encoded["data"][0]["embedding"]
    assert isinstance(text, str) and base64.b64encode(base64.b64decode(text)).decode() == text
    values = list(struct.unpack("<5f", base64.b64decode(text)))
    assert values == floats["data"][0]["embedding"] and len(values) == 5
    null = client.post(EMBEDDINGS, json={"input": "x [[sim dims=5]]", "encoding_format": None})
    assert null.json() == floats


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"input": []}, 422, "input must contain at least one entry."),
        (
            {"input": "x", "dimensions": 64},
            422,
            "Custom embedding dimensions (64) are not supported.",
        ),
        ({"input": ""}, 500, "Received an empty prompt."),
        ({"input": ["a", ""]}, 500, "Received an empty prompt."),
        ({"input": [[1], []]}, 500, "Received an empty prompt."),
    ],
)
def test_handler_refusals(client: httpx.Client, body: Any, status: int, message: str) -> None:
    response = client.post(EMBEDDINGS, json=body)
    assert (response.status_code, response.json()) == (status, {"message": message})


def test_unknown_model_is_422_unlike_chat(client: httpx.Client) -> None:
    response = client.post(EMBEDDINGS, json={"input": "x", "model": "other", "dimensions": 3})
    assert response.status_code == 422  # the model is checked before dimensions
    assert response.json()["message"].startswith("Requested model 'other' is not available.")
    assert client.post(EMBEDDINGS, json={"input": "x", "dimensions": None}).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"model": "default"},
        {"input": [1, "a"]},
        {"input": [-1]},
        {"input": [[1], "a"]},
        {"input": 5},
        {"input": "x", "encoding_format": "binary"},
        {"input": "x", "dimensions": "many"},
        {"input": "x", "model": 3},
        [1, 2],
    ],
)
def test_shape_refusals_are_axum_text(client: httpx.Client, body: Any) -> None:
    response = client.post(EMBEDDINGS, json=body)
    assert response.status_code == 422
    assert response.text.startswith("Failed to deserialize the JSON body into the target type: ")


def test_http_refusals_and_directives(client: httpx.Client) -> None:
    assert client.post(EMBEDDINGS, content=b"{}").status_code == 415
    bad = client.post(EMBEDDINGS, content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert client.get(EMBEDDINGS).status_code == 405
    other = client.post(EMBEDDINGS, json={"input": "[[sim fault=seq_gap]]"})
    assert other.status_code == 400 and other.text.startswith("simulator: fault 'seq_gap'")
    failing = client.post(EMBEDDINGS, json={"input": ["a", "[[sim status=500]]"]})
    assert (failing.status_code, failing.json()) == (500, {"message": "simulated failure"})
    dims = client.post(EMBEDDINGS, json={"input": ["[[sim dims=3]]", "b"]}).json()
    assert [len(d["embedding"]) for d in dims["data"]] == [3, 3]


def _entries(raw: Raw) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(raw.body)["data"]
    return data


def _total_minus_prompt(raw: Raw) -> int:
    usage = json.loads(raw.body)["usage"]
    return int(usage["total_tokens"] - usage["prompt_tokens"])


FAULT_CHECKS: dict[str, Callable[[Raw], bool]] = {
    "wrong_count": lambda r: [e["index"] for e in _entries(r)] == [0],
    "bad_index": lambda r: [e["index"] for e in _entries(r)] == [1, 0],
    "bad_usage": lambda r: _total_minus_prompt(r) == 1,
    "non_finite": lambda r: (
        b'"embedding":[1e999,' in r.body and math.isinf(_entries(r)[0]["embedding"][0])
    ),
    "close_mid": lambda r: r.head_bytes == 0 and r.ending in ("eof", "reset"),
    "hang": lambda r: r.head_bytes == 0 and r.ending == "timeout",
    "hang_headers": lambda r: r.head_bytes == 0 and r.ending == "timeout",
    "wrong_content_type": lambda r: r.header("content-type") == "text/plain; charset=utf-8",
    "gzip": lambda r: (
        r.header("content-encoding") == "gzip"
        and json.loads(gzip.decompress(r.body))["object"] == "list"
    ),
    "redirect": lambda r: r.status == 307 and r.header("location") == "/sim/redirected",
    "wrong_request_id": lambda r: r.header("x-request-id") not in (None, "mine-1"),
    "no_request_id": lambda r: r.header("x-request-id") is None,
    "huge_headers": lambda r: r.head_bytes > 200 * 1024 and len(_entries(r)) == 2,
}


def test_every_fault_has_a_check() -> None:
    assert set(FAULT_CHECKS) == EMBEDDINGS_FAULTS


@pytest.mark.parametrize("fault", sorted(FAULT_CHECKS))
def test_fault_produces_its_bytes(sim: Simulator, fault: str) -> None:
    sim.reset()
    body = {"input": [f"[[sim fault={fault}]]", "second input"]}
    request = http_request(EMBEDDINGS, body, headers={"x-request-id": "mine-1"})
    raw = read_raw(sim.port, request, 0.3 if fault.startswith("hang") else 5.0)
    assert FAULT_CHECKS[fault](raw), raw


def test_non_finite_in_base64_is_a_nan(client: httpx.Client) -> None:
    body = {"input": "[[sim fault=non_finite]]", "encoding_format": "base64"}
    text = client.post(EMBEDDINGS, json=body).json()["data"][0]["embedding"]
    values = struct.unpack("<8f", base64.b64decode(text))
    assert math.isnan(values[0]) and all(math.isfinite(v) for v in values[1:])
    single = client.post(EMBEDDINGS, json={"input": "[[sim fault=bad_index]]"}).json()
    assert [d["index"] for d in single["data"]] == [1]
