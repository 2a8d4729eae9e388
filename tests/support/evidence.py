"""Evidence helpers for integration tests: uploads, media parts, what the store holds."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import httpx

from gateway.testing.samples import SAMPLES
from gateway.testing.simulator import SimRequest
from tests.support.poll import eventually
from tests.support.stack import Stack, chat_body

PNG = SAMPLES["tiny.png"]()
WAV = SAMPLES["tiny.wav"]()
MP4 = SAMPLES["tiny.mp4"]()
UNKNOWN_ID = "ev_" + "a" * 26
LEASES = "gateway_evidence_leases_active"
RECORD_KEYS = {"id", "object", "sha256", "media_type", "bytes", "created", "locator_sha256"}


BASE_LIMITS = {"max_output_tokens": 512, "requests_per_minute": 6000}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(
    stack: Stack,
    data: bytes,
    content_type: str,
    *,
    tenant: str = "acme",
    locator: str | None = None,
) -> httpx.Response:
    headers = stack.headers(stack.rs256(tenant=tenant), **{"content-type": content_type})
    if locator is not None:
        headers["x-evidence-locator"] = locator
    return httpx.post(f"{stack.url}/v1/evidence", content=data, headers=headers)


def staged(stack: Stack, data: bytes, content_type: str, **kwargs: Any) -> dict[str, Any]:
    response = upload(stack, data, content_type, **kwargs)
    assert response.status_code == 201, response.text
    record: dict[str, Any] = response.json()
    return record


def media_part(kind: str, url: str) -> dict[str, Any]:
    key = f"{kind}_url"
    return {"type": key, key: {"url": url}}


def multimodal(*parts: dict[str, Any], text: str = "describe", stream: bool = True) -> Any:
    content = [*parts, {"type": "text", "text": text}]
    return chat_body(stream=stream, messages=[{"role": "user", "content": content}])


def chat(stack: Stack, body: Any, tenant: str = "acme") -> httpx.Response:
    return httpx.post(
        f"{stack.url}/v1/chat/completions",
        json=body,
        headers=stack.headers(stack.rs256(tenant=tenant)),
        timeout=10,
    )


def worker_parts(request: SimRequest) -> list[dict[str, Any]]:
    assert isinstance(request.json, dict)
    messages: list[dict[str, Any]] = request.json["messages"]
    parts: list[dict[str, Any]] = messages[-1]["content"]
    return parts


def url_of(part: dict[str, Any]) -> str:
    url: str = part[part["type"]]["url"]
    return url


def decoded(url: str) -> tuple[str, bytes]:
    head, _, payload = url.partition(",")
    assert head.startswith("data:") and head.endswith(";base64")
    return head[5:-7], base64.b64decode(payload, validate=True)


def files_in(stack: Stack) -> set[str]:
    """The evidence files staged (not the lock, temps, or the tenant files'
    own directory, ``files/``)."""
    directory = Path(stack.runtime.config.staging.dir)
    return {p.name for p in directory.iterdir() if not p.name.startswith(".") and p.is_file()}


def no_leases(stack: Stack) -> bool:
    return eventually(lambda: stack.metric(LEASES) == 0)


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code
