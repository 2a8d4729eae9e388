"""Evidence staging end to end: upload, isolation, rewriting, leases (spec §5, §12).

Every test runs a real gateway (uvicorn) in front of the protocol simulator
on 127.0.0.1; what the worker received is read back from the simulator.
"""

from __future__ import annotations

import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gateway.testing.harness import SIM_ROUTE
from gateway.testing.samples import build_wav
from gateway.tools import cli
from tests.support import rawhttp
from tests.support.evidence import (
    BASE_LIMITS,
    LEASES,
    MP4,
    PNG,
    RECORD_KEYS,
    UNKNOWN_ID,
    WAV,
    chat,
    decoded,
    error_code,
    files_in,
    media_part,
    multimodal,
    no_leases,
    sha,
    staged,
    upload,
    url_of,
    worker_parts,
)
from tests.support.poll import eventually
from tests.support.stack import Stack, chat_body, running_stack, sse_data, worker_posts
from tests.support.urls import CALLER_URLS

# ------------------------------------------------------------------- uploads


def test_upload_returns_the_record_and_get_returns_it_again(stack: Stack) -> None:
    response = upload(stack, PNG, "image/png", locator="s3://case-7/scan.png")
    assert response.status_code == 201
    record = response.json()
    assert set(record) == RECORD_KEYS
    assert record["object"] == "evidence"
    assert record["sha256"] == sha(PNG)
    assert record["media_type"] == "image/png"
    assert record["bytes"] == len(PNG)
    assert record["locator_sha256"] == sha(b"s3://case-7/scan.png")
    assert record["id"].startswith("ev_")
    with stack.client(stack.rs256()) as client:
        again = client.get(f"/v1/evidence/{record['id']}")
    assert again.status_code == 200
    assert again.json() == record
    stored = Path(stack.runtime.config.staging.dir) / f"{sha(PNG)}.png"
    assert stored.read_bytes() == PNG
    assert stored.stat().st_mode & 0o222 == 0  # read-only


def test_cli_evidence_add_uses_the_same_catalog_and_shape(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "clip.wav"
    sample.write_bytes(WAV)
    config = str(stack.gw.loaded.config_path)
    argv = ["evidence", "add", "--config", config, "--tenant", "acme", "--locator", "L1"]
    assert cli.main([*argv, str(sample)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == RECORD_KEYS
    assert printed["sha256"] == sha(WAV)
    assert printed["media_type"] == "audio/wav"
    assert printed["bytes"] == len(WAV)
    assert printed["locator_sha256"] == sha(b"L1")
    with stack.client(stack.rs256()) as client:
        served = client.get(f"/v1/evidence/{printed['id']}")
    assert served.status_code == 200
    assert served.json() == printed
    # An upload of the same bytes over HTTP reuses the file the CLI stored.
    assert staged(stack, WAV, "audio/wav")["sha256"] == printed["sha256"]
    assert files_in(stack) == {f"{sha(WAV)}.wav"}


def test_cli_evidence_add_refuses_unknown_bytes(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "notes.txt"
    sample.write_bytes(b"just some text, not media")
    config = str(stack.gw.loaded.config_path)
    assert cli.main(["evidence", "add", "--config", config, "--tenant", "acme", str(sample)]) == 1
    assert "unsupported_media_type" in capsys.readouterr().err
    assert files_in(stack) == set()


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (PNG, "audio/wav"),
        (WAV, "image/png"),
        (MP4, "image/jpeg"),
        (b"plain text, not media", "image/gif"),
        (PNG, "application/octet-stream"),
    ],
)
def test_upload_with_mismatched_bytes_is_415(stack: Stack, data: bytes, content_type: str) -> None:
    response = upload(stack, data, content_type)
    assert response.status_code == 415
    assert error_code(response) == "unsupported_media_type"
    assert files_in(stack) == set()


def test_upload_above_the_tenant_media_limit_is_413(tmp_path: Path) -> None:
    big_wav = build_wav(seconds=0.2)
    assert len(PNG) < 100 < len(WAV) < 1000 < len(big_wav)
    # max_body_bytes bounds JSON bodies, not uploads; max_media_bytes bounds uploads.
    acme = {"limits": {**BASE_LIMITS, "max_body_bytes": 100, "max_media_bytes": 1000}}
    with running_stack(tmp_path, acme=acme) as stack:
        response = upload(stack, big_wav, "audio/wav")
        assert response.status_code == 413
        assert error_code(response) == "body_too_large"
        assert files_in(stack) == set()
        assert staged(stack, WAV, "audio/wav")["bytes"] == len(WAV)
        # The limit is the tenant's own: globex keeps the global ceiling.
        assert staged(stack, big_wav, "audio/wav", tenant="globex")["bytes"] == len(big_wav)


def test_upload_needs_the_evidence_scope(stack: Stack) -> None:
    record = staged(stack, PNG, "image/png")
    token = stack.rs256(scope="inference")
    response = httpx.post(
        f"{stack.url}/v1/evidence",
        content=PNG,
        headers=stack.headers(token, **{"content-type": "image/png"}),
    )
    assert response.status_code == 403
    assert error_code(response) == "insufficient_scope"
    with stack.client(token) as client:
        assert error_code(client.get(f"/v1/evidence/{record['id']}")) == "insufficient_scope"
        assert client.delete(f"/v1/evidence/{record['id']}").status_code == 403
    with stack.client(stack.rs256()) as client:
        assert client.get(f"/v1/evidence/{record['id']}").json() == record
        assert client.delete(f"/v1/evidence/{record['id']}").status_code == 204
        gone = client.delete(f"/v1/evidence/{record['id']}")
    assert error_code(gone) == "evidence_not_found"
    assert files_in(stack) == set()


def test_non_ascii_locator_digest_matches_the_cli(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locator = "s3://akte/straße/ü.png"
    headers = [
        *((k.encode(), v.encode()) for k, v in stack.headers(stack.rs256()).items()),
        (b"content-type", b"image/png"),
        (b"x-evidence-locator", locator.encode("utf-8")),
    ]
    response = httpx.post(f"{stack.url}/v1/evidence", content=PNG, headers=headers)
    assert response.status_code == 201
    assert response.json()["locator_sha256"] == sha(locator.encode("utf-8"))

    sample = tmp_path / "scan.png"
    sample.write_bytes(PNG)
    config = str(stack.gw.loaded.config_path)
    argv = ["evidence", "add", "--config", config, "--tenant", "acme", "--locator", locator]
    assert cli.main([*argv, str(sample)]) == 0
    assert json.loads(capsys.readouterr().out)["locator_sha256"] == sha(locator.encode("utf-8"))

    bad = [*headers[:-1], (b"x-evidence-locator", b"\xff\xfe")]
    refused = httpx.post(f"{stack.url}/v1/evidence", content=PNG, headers=bad)
    assert refused.status_code == 400
    assert error_code(refused) == "invalid_request"


def test_concurrent_uploads_of_the_same_bytes_store_one_file(tmp_path: Path) -> None:
    staging = {"dir": "var/evidence", "catalog": "var/catalog.sqlite3", "max_concurrent_uploads": 8}
    with running_stack(tmp_path, staging=staging) as stack:

        def one(n: int) -> httpx.Response:
            return upload(stack, MP4, "video/mp4", locator=f"camera/{n}")

        with ThreadPoolExecutor(max_workers=8) as pool:
            responses = list(pool.map(one, range(8)))
        assert [r.status_code for r in responses] == [201] * 8
        records = [r.json() for r in responses]
        assert len({r["id"] for r in records}) == 8
        assert {r["sha256"] for r in records} == {sha(MP4)}
        assert files_in(stack) == {f"{sha(MP4)}.mp4"}
        with stack.client(stack.rs256()) as client:
            for record in records[:-1]:
                assert client.delete(f"/v1/evidence/{record['id']}").status_code == 204
            assert files_in(stack) == {f"{sha(MP4)}.mp4"}
            assert client.delete(f"/v1/evidence/{records[-1]['id']}").status_code == 204
        assert files_in(stack) == set()


# ---------------------------------------------------------------- isolation


@pytest.mark.parametrize(("owner", "other"), [("acme", "globex"), ("globex", "acme")])
def test_tenants_cannot_see_each_others_evidence(stack: Stack, owner: str, other: str) -> None:
    record = staged(stack, PNG, "image/png", tenant=owner)
    with stack.client(stack.rs256(tenant=other)) as client:
        unknown_get = client.get(f"/v1/evidence/{UNKNOWN_ID}")
        foreign_get = client.get(f"/v1/evidence/{record['id']}")
        unknown_delete = client.delete(f"/v1/evidence/{UNKNOWN_ID}")
        foreign_delete = client.delete(f"/v1/evidence/{record['id']}")
    for response in (unknown_get, foreign_get, unknown_delete, foreign_delete):
        assert response.status_code == 404
        assert error_code(response) == "evidence_not_found"
    assert foreign_get.content == unknown_get.content
    assert foreign_delete.content == unknown_delete.content
    assert record["id"] not in foreign_get.text

    foreign_use = chat(stack, multimodal(media_part("image", f"evidence:{record['id']}")), other)
    unknown_use = chat(stack, multimodal(media_part("image", f"evidence:{UNKNOWN_ID}")), other)
    assert foreign_use.status_code == unknown_use.status_code == 404
    assert foreign_use.content == unknown_use.content
    assert error_code(foreign_use) == "evidence_not_found"
    assert worker_posts(stack.sim) == []
    # Four refusals on the evidence routes and two on inference, each counted once.
    # (Counted just after each reply leaves, so read with a deadline.)
    labels = {"tenant": other, "code": "evidence_not_found"}
    assert eventually(lambda: stack.metric("gateway_rejections_total", **labels) == 6)

    # The owner still has it, untouched by the other tenant's DELETE.
    with stack.client(stack.rs256(tenant=owner)) as client:
        assert client.get(f"/v1/evidence/{record['id']}").json() == record
    receipt = stack.receipt(foreign_use.headers["x-request-id"])
    assert (receipt["outcome"], receipt["error_code"]) == ("rejected", "evidence_not_found")
    assert receipt["request_sha256"] is None
    assert no_leases(stack)


# ---------------------------------------------------------- worker references


def test_multimodal_request_sends_verified_data_urls_in_order(stack: Stack) -> None:
    image = staged(stack, PNG, "image/png", locator="case/1/photo")
    audio = staged(stack, WAV, "audio/wav")
    video = staged(stack, MP4, "video/mp4", locator="case/1/clip")
    body = multimodal(
        media_part("image", f"evidence:{image['id']}"),
        media_part("audio", f"evidence:{audio['id']}"),
        media_part("video", f"evidence:{video['id']}"),
    )
    response = chat(stack, body)
    assert response.status_code == 200, response.text
    assert sse_data(response.text)[-1] == "[DONE]"

    [received] = worker_posts(stack.sim)
    assert isinstance(received.json, dict)
    assert received.json["model"] == SIM_ROUTE
    parts = worker_parts(received)
    assert [p["type"] for p in parts] == ["image_url", "audio_url", "video_url", "text"]
    assert parts[3] == {"type": "text", "text": "describe"}
    seen = [decoded(url_of(p)) for p in parts[:3]]
    assert [mime for mime, _ in seen] == ["image/png", "audio/wav", "video/mp4"]
    assert [sha(data) for _, data in seen] == [image["sha256"], audio["sha256"], video["sha256"]]
    assert "evidence:" not in received.body.decode()

    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == "complete"
    assert receipt["artifacts"] == [
        {"evidence_id": r["id"], "sha256": r["sha256"], "media_type": r["media_type"]}
        for r in (image, audio, video)
    ]
    assert receipt["locator_sha256"] == [sha(b"case/1/photo"), None, sha(b"case/1/clip")]
    assert receipt["request_sha256"] == sha(received.body)
    assert receipt["request_bytes"] == len(received.body)
    assert receipt["dropped_parts"] == []
    assert no_leases(stack)


def test_file_url_mode_sends_store_references(tmp_path: Path) -> None:
    staging = {
        "worker_media": "file_url",
        "worker_url_prefix": "file:///srv/mosaic-evidence",
        "dir": "var/evidence",
        "catalog": "var/catalog.sqlite3",
    }
    with running_stack(tmp_path, staging=staging) as stack:
        audio = staged(stack, WAV, "audio/wav")
        image = staged(stack, PNG, "image/png")
        body = multimodal(
            media_part("audio", f"evidence:{audio['id']}"),
            media_part("image", f"evidence:{image['id']}"),
        )
        response = chat(stack, body)
        assert response.status_code == 200, response.text
        [received] = worker_posts(stack.sim)
        assert [url_of(p) for p in worker_parts(received)[:2]] == [
            f"file:///srv/mosaic-evidence/{sha(WAV)}.wav",
            f"file:///srv/mosaic-evidence/{sha(PNG)}.png",
        ]
        # The names the worker is given are the files the gateway stored.
        assert files_in(stack) == {f"{sha(WAV)}.wav", f"{sha(PNG)}.png"}
        receipt = stack.receipt(response.headers["x-request-id"])
        assert [a["sha256"] for a in receipt["artifacts"]] == [sha(WAV), sha(PNG)]
        assert no_leases(stack)


def test_every_caller_url_form_is_refused_before_the_worker(stack: Stack) -> None:
    record = staged(stack, PNG, "image/png")
    for url in CALLER_URLS:
        body = multimodal(media_part("image", f"evidence:{record['id']}"), media_part("image", url))
        response = chat(stack, body)
        assert response.status_code == 400, url
        assert error_code(response) == "caller_url_forbidden", url
        assert url.strip() not in response.text
        receipt = stack.receipt(response.headers["x-request-id"])
        assert (receipt["outcome"], receipt["error_code"]) == ("rejected", "caller_url_forbidden")
        assert receipt["request_sha256"] is None
    assert worker_posts(stack.sim) == []
    assert no_leases(stack)


def test_modality_mismatch_is_refused_before_the_worker(stack: Stack) -> None:
    audio = staged(stack, WAV, "audio/wav")
    response = chat(stack, multimodal(media_part("image", f"evidence:{audio['id']}")))
    assert response.status_code == 400
    assert error_code(response) == "modality_not_allowed"
    assert worker_posts(stack.sim) == []
    assert no_leases(stack)


def test_forwarded_body_over_the_worker_limit_is_refused(tmp_path: Path) -> None:
    # Two WAVs fit the media limit; as base64 beside a long prompt they do not
    # fit the worker's body limit.
    sections: dict[str, Any] = {
        "upstream": {"max_request_bytes": 3000},
        "limits": {"max_media_bytes": 2000},
    }
    with running_stack(tmp_path, **sections) as stack:
        audio = staged(stack, WAV, "audio/wav")
        part = media_part("audio", f"evidence:{audio['id']}")
        fits = chat(stack, multimodal(part, part))
        assert fits.status_code == 200, fits.text
        too_big = chat(stack, multimodal(part, part, text="x" * 800))
        assert too_big.status_code == 400
        assert error_code(too_big) == "media_limit_exceeded"
        assert len(worker_posts(stack.sim)) == 1
        assert len(worker_posts(stack.sim)[0].body) <= 3000
        assert no_leases(stack)


# ------------------------------------------------------------------- leases


def test_a_lease_keeps_a_deleted_records_file_until_the_stream_ends(stack: Stack) -> None:
    record = staged(stack, PNG, "image/png")
    name = f"{sha(PNG)}.png"
    body = multimodal(
        media_part("image", f"evidence:{record['id']}"), text="[[sim chunks=20 delay_ms=50]]"
    )
    lines: list[str] = []
    with (
        stack.client(stack.rs256(), timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        stream = response.iter_lines()
        for line in stream:  # bounded: the simulator sends 20 chunks, then [DONE]
            lines.append(line)
            if line.startswith("data: {"):
                break
        assert stack.metric(LEASES) == 1
        deleted = client.delete(f"/v1/evidence/{record['id']}")
        assert deleted.status_code == 204
        assert client.get(f"/v1/evidence/{record['id']}").status_code == 404
        assert name in files_in(stack)
        lines.extend(stream)
    assert "data: [DONE]" in lines
    assert eventually(lambda: name not in files_in(stack))
    assert no_leases(stack)
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == "complete"
    assert receipt["artifacts"][0]["evidence_id"] == record["id"]


def test_leases_are_per_request_even_when_request_ids_repeat(stack: Stack) -> None:
    slow = staged(stack, PNG, "image/png")
    quick = staged(stack, WAV, "audio/wav")
    name = f"{sha(PNG)}.png"
    slow_body = multimodal(
        media_part("image", f"evidence:{slow['id']}"), text="[[sim chunks=20 delay_ms=50]]"
    )
    quick_body = multimodal(media_part("audio", f"evidence:{quick['id']}"))
    with (
        stack.client(stack.rs256(), timeout=10) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=slow_body, headers={"x-request-id": "dup-1"}
        ) as response,
    ):
        assert response.status_code == 200
        stream = response.iter_lines()
        for line in stream:
            if line.startswith("data: {"):
                break
        second = client.post(
            "/v1/chat/completions", json=quick_body, headers={"x-request-id": "dup-1"}
        )
        assert second.status_code == 200
        assert client.delete(f"/v1/evidence/{slow['id']}").status_code == 204
        still_there = name in files_in(stack)
        for _ in stream:
            pass
    assert still_there, "the slow request's file went while it was still streaming"


# ------------------------------------------------------------ media policies


def test_drop_policy_removes_caller_urls_and_records_them(tmp_path: Path) -> None:
    acme = {"media": {"caller_urls": "drop", "inline_data": "reject"}}
    with running_stack(tmp_path, acme=acme) as stack:
        image = staged(stack, PNG, "image/png")
        content = [
            {"type": "text", "text": "one"},
            media_part("image", "https://example.com/a.png"),
            media_part("image", f"evidence:{image['id']}"),
            media_part("audio", "data:audio/wav;base64," + base64.b64encode(WAV).decode()),
            media_part("video", " FILE:///etc/passwd"),
            {"type": "text", "text": "two"},
        ]
        body = chat_body(stream=True, messages=[{"role": "user", "content": content}])
        response = chat(stack, body)
        assert response.status_code == 200, response.text
        [received] = worker_posts(stack.sim)
        parts = worker_parts(received)
        assert [p["type"] for p in parts] == ["text", "image_url", "text"]
        assert sha(decoded(url_of(parts[1]))[1]) == sha(PNG)
        for leaked in ("example.com", "passwd", base64.b64encode(WAV).decode()[:40]):
            assert leaked not in received.body.decode()
        receipt = stack.receipt(response.headers["x-request-id"])
        assert receipt["dropped_parts"] == [1, 3, 4]
        assert [a["evidence_id"] for a in receipt["artifacts"]] == [image["id"]]
        # globex keeps the default policy: the same request is refused there.
        refused = chat(stack, body, tenant="globex")
        assert error_code(refused) == "caller_url_forbidden"
        assert len(worker_posts(stack.sim)) == 1


def test_inline_stage_policy_stages_data_urls(tmp_path: Path) -> None:
    acme = {"media": {"caller_urls": "reject", "inline_data": "stage"}}
    with running_stack(tmp_path, acme=acme) as stack:
        inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
        audio = staged(stack, WAV, "audio/wav")
        body = multimodal(
            media_part("image", inline), media_part("audio", f"evidence:{audio['id']}")
        )
        response = chat(stack, body)
        assert response.status_code == 200, response.text
        [received] = worker_posts(stack.sim)
        parts = worker_parts(received)
        mime, data = decoded(url_of(parts[0]))
        assert (mime, data) == ("image/png", PNG)
        assert sha(decoded(url_of(parts[1]))[1]) == sha(WAV)
        receipt = stack.receipt(response.headers["x-request-id"])
        assert [(a["sha256"], a["media_type"]) for a in receipt["artifacts"]] == [
            (sha(PNG), "image/png"),
            (sha(WAV), "audio/wav"),
        ]
        # Inline data is staged for this request only: record and file go with it.
        inline_id = receipt["artifacts"][0]["evidence_id"]
        assert inline_id.startswith("ev_")
        with stack.client(stack.rs256()) as client:
            assert client.get(f"/v1/evidence/{inline_id}").status_code == 404
        assert eventually(lambda: files_in(stack) == {f"{sha(WAV)}.wav"})

        # Bytes that are not what the data URL declares never reach the worker.
        wrong = "data:image/png;base64," + base64.b64encode(WAV).decode()
        junk = "data:image/png;base64," + base64.b64encode(b"not an image").decode()
        for url in (wrong, junk):
            refused = chat(stack, multimodal(media_part("image", url)))
            assert refused.status_code == 415
            assert error_code(refused) == "unsupported_media_type"
        # Other caller URLs stay refused.
        http_url = chat(stack, multimodal(media_part("image", "https://example.com/a.png")))
        assert error_code(http_url) == "caller_url_forbidden"
        assert len(worker_posts(stack.sim)) == 1
        assert no_leases(stack)


def test_disconnect_while_media_resolves_still_gives_everything_back(tmp_path: Path) -> None:
    """The caller leaves while the task staging and leasing its media still runs:
    the request waits for that task, then releases its lease and staged file."""
    acme = {"media": {"caller_urls": "reject", "inline_data": "stage"}}
    with running_stack(tmp_path, acme=acme) as stack:
        runtime = stack.runtime
        entered, release = threading.Event(), threading.Event()
        original = runtime.evidence.upload_inline

        async def held_upload(*args: Any, **kwargs: Any) -> Any:
            # Held off the loop (the service is async): the loop must stay free
            # to see the caller leave while the staging waits.
            entered.set()
            await anyio.to_thread.run_sync(release.wait, 5)
            return await original(*args, **kwargs)

        runtime.evidence.upload_inline = held_upload
        inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
        body = json.dumps(multimodal(media_part("image", inline))).encode()
        sock = rawhttp.connect(int(stack.url.rsplit(":", 1)[1]))
        try:
            sock.sendall(
                rawhttp.chat_post(
                    stack.rs256(), [("x-request-id", "leaves-mid-resolve")], body=body
                )
            )
            assert entered.wait(5)
        finally:
            sock.close()
        assert eventually(lambda: any(e.disconnected for e in runtime.inflight))
        release.set()
        receipt = stack.receipt("leaves-mid-resolve")
        assert receipt["outcome"] == "canceled"
        assert [a["sha256"] for a in receipt["artifacts"]] == [sha(PNG)]
        assert eventually(lambda: no_leases(stack))
        assert eventually(lambda: files_in(stack) == set())
        assert worker_posts(stack.sim) == []
