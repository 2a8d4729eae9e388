"""Tenant files through the real gateway (spec §22 "Files"): the record, the
content with the headers that keep a produced file from running in the
gateway's origin, delete, and nothing of another tenant's. Files are put
through the running gateway's own book (the agentic stream that produces
them is the pipeline's); every read goes over HTTP, with the openai SDK too."""

from __future__ import annotations

import asyncio
import hashlib
import stat
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest

from gateway.books.files.records import FileRecord, new_file_id
from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.evidence import PNG
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack, worker_posts

T = TypeVar("T")
ENDPOINTS = ["chat.completions", "models", "evidence", "files"]
HTML = b"<!doctype html><script>fetch('/v1/files?x='+document.cookie)</script>"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    policy = {"endpoints": ENDPOINTS}
    try:
        with running_stack(tmp_path_factory.mktemp("files"), acme=policy, globex=policy) as s:
            yield s
    finally:
        mp.undo()


def on_loop(stack: Stack, coro: Coroutine[Any, Any, T]) -> T:
    loop = stack.gw.server.server.servers[0].get_loop()
    return asyncio.run_coroutine_threadsafe(coro, loop).result(10)


def put(stack: Stack, data: bytes, name: str, tenant: str = "acme") -> FileRecord:
    """A file as an agent run of ``tenant`` would leave it."""
    record: FileRecord = on_loop(stack, stack.runtime.files.put(tenant, data, name))
    return record


def client(stack: Stack, tenant: str = "acme") -> httpx.Client:
    return stack.client(stack.rs256(tenant=tenant))


def error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_the_record_is_an_openai_file_object_with_its_digest_and_sniffed_type(
    stack: Stack,
) -> None:
    record = put(stack, PNG, "chart.png")
    with client(stack) as c:
        answer = c.get(f"/v1/files/{record.id}")
    assert answer.status_code == 200
    assert answer.json() == {
        "id": record.id,
        "object": "file",
        "bytes": len(PNG),
        "created_at": record.created,
        "filename": "chart.png",
        "purpose": "agent_output",
        "mime_type": "image/png",
        "sha256": hashlib.sha256(PNG).hexdigest(),
    }
    sdk = stack.sdk()
    got = sdk.files.retrieve(record.id)
    assert (got.id, got.bytes, got.filename, got.object) == (
        record.id,
        len(PNG),
        "chart.png",
        "file",
    )
    # What docs/callers.md reads of it: the gateway's fields beside the SDK's.
    assert got.model_extra is not None and got.model_extra["mime_type"] == "image/png"
    assert got.purpose == "agent_output"  # type: ignore[comparison-overlap]
    assert sdk.files.content(record.id).content == PNG


def test_content_is_an_attachment_never_a_document_of_the_gateways_origin(stack: Stack) -> None:
    """A model's HTML (stored XSS in waiting): served as plain text, as an
    attachment, not sniffable, sandboxed, not cached."""
    record = put(stack, HTML, "../index.html")
    with client(stack) as c:
        answer = c.get(f"/v1/files/{record.id}/content")
    assert answer.status_code == 200
    assert answer.content == HTML
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert answer.headers["content-length"] == str(len(HTML))
    assert answer.headers["content-disposition"] == (
        "attachment; filename=\"index.html\"; filename*=UTF-8''index.html"
    )
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["content-security-policy"] == "sandbox"
    assert answer.headers["cache-control"] == "private, no-store"


def test_a_name_cannot_break_out_of_its_header(stack: Stack) -> None:
    record = put(stack, b"a,b\n", 'q"uote\r\nSet-Cookie: x=1;\u00e9%.csv')
    with client(stack) as c:
        answer = c.get(f"/v1/files/{record.id}/content")
    assert answer.status_code == 200
    assert "set-cookie" not in answer.headers
    assert answer.headers["content-disposition"] == (
        'attachment; filename="q_uote__Set-Cookie: x=1;__.csv"; '
        "filename*=UTF-8''q%22uote__Set-Cookie%3A%20x%3D1%3B%C3%A9%25.csv"
    )


def test_a_binary_file_keeps_its_sniffed_type_and_bytes(stack: Stack) -> None:
    data = bytes(range(256)) * 4000  # about 1 MB: several pieces
    record = put(stack, data, "dump.bin")
    with client(stack) as c, c.stream("GET", f"/v1/files/{record.id}/content") as answer:
        assert answer.headers["content-type"] == "application/octet-stream"
        body = b"".join(answer.iter_bytes())
    assert body == data


def test_another_tenants_file_is_exactly_an_unknown_one(stack: Stack) -> None:
    record = put(stack, PNG, "mine.png")
    unknown = new_file_id()
    with client(stack, "globex") as c:
        answers = {
            (method, path): c.request(method, path.format(id=file_id))
            for file_id in (record.id, unknown)
            for method, path in (
                ("GET", "/v1/files/{id}"),
                ("GET", "/v1/files/{id}/content"),
                ("DELETE", "/v1/files/{id}"),
            )
        }
    bodies = {(k, a.status_code, a.text) for k, a in answers.items()}
    assert {(status, text) for _, status, text in bodies} == {
        (
            404,
            '{"error":{"message":"No such file.","type":"not_found_error",'
            '"code":"file_not_found","param":null}}',
        )
    }
    with client(stack) as c:
        assert c.get(f"/v1/files/{record.id}/content").content == PNG  # still acme's
    with pytest.raises(openai.NotFoundError) as info:
        stack.sdk(stack.rs256(tenant="globex")).files.retrieve(record.id)
    assert info.value.code == "file_not_found"


def test_delete_forgets_the_file_and_its_blob(stack: Stack) -> None:
    data = b"only here " + new_file_id().encode()
    record = put(stack, data, "once.txt")
    blob = Path(stack.runtime.config.staging.dir) / "files" / f"{record.sha256}.txt"
    assert stat.S_IMODE(blob.stat().st_mode) == 0o440
    deleted = stack.sdk().files.delete(record.id)
    assert (deleted.id, deleted.deleted) == (record.id, True)
    with client(stack) as c:
        again = c.delete(f"/v1/files/{record.id}")
        gone = c.get(f"/v1/files/{record.id}/content")
    assert error(again) == error(gone) == (404, "file_not_found")
    assert not blob.exists()


def test_there_is_no_listing_and_nothing_reaches_a_worker(stack: Stack) -> None:
    put(stack, PNG, "listed.png")
    with client(stack) as c:
        assert error(c.get("/v1/files")) == (404, "not_found")
        assert error(c.post("/v1/files", json={})) == (404, "not_found")
        assert error(c.get("/v1/files/file_x")) == (404, "file_not_found")
        assert error(c.post(f"/v1/files/{new_file_id()}", json={})) == (
            405,
            "method_not_allowed",
        )
    assert worker_posts(stack.sim) == []
    assert not [r for r in stack.sim.requests() if r.path.startswith("/v1/files")]


def test_files_need_credentials_the_files_endpoint_and_the_inference_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEMO_SECRET_ENV, HS_SECRET)
    with running_stack(
        tmp_path, acme={"endpoints": ENDPOINTS}, globex={"endpoints": ["chat.completions"]}
    ) as s:
        record = put(s, PNG, "a.png")
        path = f"/v1/files/{record.id}"
        assert error(httpx.get(s.url + path)) == (401, "missing_credentials")
        with s.client(s.rs256(scope="evidence")) as c:
            assert error(c.get(path)) == (403, "insufficient_scope")
        with s.client(s.rs256(tenant="globex")) as c:
            assert error(c.get(path)) == (403, "endpoint_not_allowed")
        with s.client(s.rs256(scope="inference")) as c:
            assert c.get(path).status_code == 200


def test_files_past_the_ttl_are_forgotten_by_the_periodic_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEMO_SECRET_ENV, HS_SECRET)
    acme = {"endpoints": ENDPOINTS, "evidence": {"ttl_s": 1}}
    with running_stack(tmp_path, acme=acme, staging={"expiry_sweep_s": 0.2}) as s:
        record = put(s, b"short-lived\n", "brief.txt")
        blob = Path(s.runtime.config.staging.dir) / "files" / f"{record.sha256}.txt"
        assert blob.exists()
        deadline = time.monotonic() + 10
        while blob.exists():
            assert time.monotonic() < deadline, "the sweep never removed the expired file"
            time.sleep(0.05)
        with s.client() as c:
            assert error(c.get(f"/v1/files/{record.id}")) == (404, "file_not_found")
