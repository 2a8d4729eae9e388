"""Evidence bounded before it is spent (spec §13), through the real gateway.

Quotas, identical re-uploads, uploads counted against the rate limit and
bounded in concurrency, listing, expiry, deletes on a full volume, and media
that is read only after admission -- each asserted on what the store, the
catalog and the worker saw, never on timing.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from gateway.books.state.sqlite.catalog import Catalog
from tests.support import pixels
from tests.support.evidence import (
    BASE_LIMITS,
    PNG,
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
from tests.support.stack import Stack, chat_body, running_stack, worker_posts
from tests.support.tmpfs import fill, free, small_fs

STAGING = {"dir": "var/evidence", "catalog": "var/catalog.sqlite3"}


def big_png(size: int) -> bytes:
    """``size`` bytes the sniffer takes for a PNG (magic, then filler)."""
    head = PNG[:64]
    return head + os.urandom(1024) + b"\0" * (size - len(head) - 1024)


def records_of(stack: Stack, tenant: str = "acme") -> int:
    """The tenant's live records, read from the SQLite file itself (the test's thread
    is not the server's loop)."""
    with Catalog(Path(stack.runtime.config.staging.catalog)) as catalog:
        return catalog.usage(tenant)[0]


# -- quotas, identical re-uploads, listing --------------------------------------


def test_uploads_past_the_record_quota_are_403_and_store_nothing(tmp_path: Path) -> None:
    acme = {"evidence": {"max_records": 2, "max_bytes": 10_000_000}}
    with running_stack(tmp_path, acme=acme) as stack:
        staged(stack, PNG, "image/png", locator="a")
        staged(stack, WAV, "audio/wav", locator="b")
        third = upload(stack, PNG, "image/png", locator="c")
        assert third.status_code == 403 and error_code(third) == "evidence_quota_exceeded"
        assert records_of(stack) == 2
        assert files_in(stack) == {f"{sha(PNG)}.png", f"{sha(WAV)}.wav"}
        # The same bytes under the same locator are the existing record, not a new one.
        again = upload(stack, PNG, "image/png", locator="a")
        assert again.status_code == 200 and records_of(stack) == 2


def test_uploads_past_the_byte_quota_are_403_before_the_body_is_kept(tmp_path: Path) -> None:
    acme = {"evidence": {"max_records": 100, "max_bytes": len(PNG) + len(WAV) - 1}}
    with running_stack(tmp_path, acme=acme) as stack:
        staged(stack, PNG, "image/png")
        refused = upload(stack, WAV, "audio/wav")
        assert refused.status_code == 403 and error_code(refused) == "evidence_quota_exceeded"
        assert files_in(stack) == {f"{sha(PNG)}.png"}
        temps = [p for p in Path(stack.runtime.config.staging.dir).iterdir() if ".tmp" in p.name]
        assert temps == []


def test_identical_reupload_answers_200_with_the_existing_record(stack: Stack) -> None:
    first = upload(stack, WAV, "audio/wav", locator="rec/1")
    assert first.status_code == 201
    for _ in range(5):
        again = upload(stack, WAV, "audio/wav", locator="rec/1")
        assert again.status_code == 200 and again.json() == first.json()
    other = upload(stack, WAV, "audio/wav", locator="rec/2")
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert records_of(stack) == 2
    # Another tenant's identical upload is its own record.
    theirs = upload(stack, WAV, "audio/wav", tenant="globex", locator="rec/1")
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]


def test_listing_is_newest_first_paged_and_tenant_scoped(stack: Stack) -> None:
    ids = [staged(stack, PNG, "image/png", locator=f"page/{i}")["id"] for i in range(5)]
    staged(stack, WAV, "audio/wav", tenant="globex")
    with stack.client() as client:
        first = client.get("/v1/evidence", params={"limit": 2}).json()
        assert first["object"] == "list" and first["has_more"] is True
        assert [r["id"] for r in first["data"]] == ids[::-1][:2]
        second = client.get("/v1/evidence", params={"limit": 2, "after": ids[3]}).json()
        assert [r["id"] for r in second["data"]] == [ids[2], ids[1]]
        rest = client.get("/v1/evidence", params={"limit": 100, "after": ids[1]}).json()
        assert [r["id"] for r in rest["data"]] == [ids[0]] and rest["has_more"] is False
        everything = client.get("/v1/evidence").json()
        assert {r["id"] for r in everything["data"]} == set(ids), "no other tenant's records"
        for bad in ("0", "101", "x"):
            response = client.get("/v1/evidence", params={"limit": bad})
            assert response.status_code == 400 and response.json()["error"]["param"] == "limit"
        unknown = client.get("/v1/evidence", params={"after": "ev_" + "b" * 26})
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "after"


# -- uploads cost: rate limit and concurrency -------------------------------------


def test_uploads_count_against_requests_per_minute(tmp_path: Path) -> None:
    acme = {"limits": {**BASE_LIMITS, "requests_per_minute": 3}}
    with running_stack(tmp_path, acme=acme) as stack:
        for n in range(2):
            assert upload(stack, PNG, "image/png", locator=f"n{n}").status_code == 201
        assert chat(stack, chat_body()).status_code == 200
        refused = upload(stack, PNG, "image/png", locator="n9")
        assert refused.status_code == 429 and error_code(refused) == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        assert records_of(stack) == 2


def test_uploads_past_max_concurrent_uploads_are_429(tmp_path: Path) -> None:
    staging = {**STAGING, "max_concurrent_uploads": 2}
    with running_stack(tmp_path, staging=staging) as stack:
        release = threading.Event()

        def slow_body() -> Iterator[bytes]:
            yield PNG[:32]
            release.wait(10)
            yield PNG[32:]

        def slow_upload(n: int) -> httpx.Response:
            headers = stack.headers(**{"content-type": "image/png", "x-evidence-locator": f"s{n}"})
            return httpx.post(
                f"{stack.url}/v1/evidence", content=slow_body(), headers=headers, timeout=20
            )

        with ThreadPoolExecutor(max_workers=2) as pool:
            started = [pool.submit(slow_upload, n) for n in range(2)]
            assert eventually(stack.runtime.uploads.locked)
            third = upload(stack, WAV, "audio/wav")
            assert third.status_code == 429 and error_code(third) == "queue_full"
            assert third.headers["retry-after"] == "1"
            release.set()
            assert [f.result().status_code for f in started] == [201, 201]
        assert upload(stack, WAV, "audio/wav").status_code == 201


# -- expiry ---------------------------------------------------------------------


def test_expired_records_are_forgotten_but_a_leased_file_stays(tmp_path: Path) -> None:
    acme = {"evidence": {"ttl_s": 1}}
    staging = {**STAGING, "expiry_sweep_s": 0.2}
    with running_stack(tmp_path, acme=acme, staging=staging) as stack:
        kept = staged(stack, PNG, "image/png", locator="leased")
        gone = staged(stack, WAV, "audio/wav", locator="alone")
        body = multimodal(media_part("image", f"evidence:{kept['id']}"))
        body["messages"][0]["content"][-1]["text"] = "slow [[sim chunks=40 delay_ms=100]]"
        with (
            stack.client(timeout=30) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            with stack.client() as other:
                assert eventually(
                    lambda: other.get(f"/v1/evidence/{gone['id']}").status_code == 404, 10
                )
                assert other.get(f"/v1/evidence/{kept['id']}").status_code == 404
                assert other.get("/v1/evidence").json()["data"] == []
            # Forgotten, as by DELETE: the unleased file goes, the leased one stays.
            assert eventually(lambda: f"{sha(WAV)}.wav" not in files_in(stack), 10)
            assert f"{sha(PNG)}.png" in files_in(stack)
            assert response.read().endswith(b"data: [DONE]\n\n")
        assert eventually(lambda: files_in(stack) == set(), 10)
        assert no_leases(stack)


def test_the_periodic_sweep_removes_a_staged_file_no_record_names(tmp_path: Path) -> None:
    """Not only at start (spec §24): a file renamed into place whose record an
    outage lost goes at the next sweep; a file a record names stays."""
    staging = {**STAGING, "expiry_sweep_s": 0.2}
    with running_stack(tmp_path, staging=staging) as stack:
        kept = staged(stack, PNG, "image/png")
        orphan = Path(stack.runtime.config.staging.dir) / f"{sha(WAV)}.wav"
        orphan.write_bytes(WAV)
        assert eventually(lambda: not orphan.exists(), 10)
        assert files_in(stack) == {f"{kept['sha256']}.png"}
        with stack.client() as client:
            assert client.get(f"/v1/evidence/{kept['id']}").status_code == 200


# -- deletes on a full volume ---------------------------------------------------------


def test_delete_succeeds_on_a_full_staging_volume(tmp_path: Path) -> None:
    with small_fs(tmp_path / "vol", 2048) as vol:
        staging = {"dir": str(vol / "evidence"), "catalog": str(vol / "catalog.sqlite3")}
        with running_stack(tmp_path / "gw", staging=staging) as stack:
            records = [staged(stack, PNG, "image/png", locator=f"f{i}") for i in range(3)]
            fill(vol)
            with stack.client() as client:
                for record in records:
                    assert client.delete(f"/v1/evidence/{record['id']}").status_code == 204
                    assert client.get(f"/v1/evidence/{record['id']}").status_code == 404
            assert files_in(stack) == set()
            free(vol)
            assert upload(stack, WAV, "audio/wav").status_code == 201


def test_a_full_volume_is_state_unavailable_for_every_writer(tmp_path: Path) -> None:
    """One tenant fills the shared volume within its quota (spec §24): its upload,
    the other tenant's upload and a kept Response are 503 state_unavailable, never
    500; /readyz stays 200 and says state_volume_full until a write succeeds."""
    endpoints = ["chat.completions", "responses", "models", "evidence"]
    with small_fs(tmp_path / "vol", 4096) as vol:
        staging = {"dir": str(vol / "evidence"), "catalog": str(vol / "catalog.sqlite3")}
        with running_stack(
            tmp_path / "gw",
            staging=staging,
            acme={"endpoints": endpoints, "evidence": {"max_bytes": 1 << 30}},
            globex={"endpoints": endpoints},
        ) as stack:
            assert "degraded" not in httpx.get(f"{stack.url}/readyz").json()
            statuses = []
            for _ in range(64):  # bounded: 4 MiB hold fewer than 32 of these
                response = upload(stack, big_png(128 * 1024), "image/png")
                statuses.append(response.status_code)
                if response.status_code != 201:
                    break
            assert statuses[0] == 201 and statuses[-1] == 503, statuses
            assert response.json()["error"]["code"] == "state_unavailable"
            fill(vol)  # the last free blocks, as the next upload would take them

            other = upload(stack, WAV, "audio/wav", tenant="globex")
            assert other.status_code == 503 and error_code(other) == "state_unavailable"
            with stack.client(stack.rs256("globex")) as client:
                kept = client.post(
                    "/v1/responses",
                    # an answer larger than any room the catalog's journal already has
                    json={"model": "gemma-4-mm", "input": "[[sim chunks=200 pad=2048]] hi"},
                    timeout=30,
                )
            assert kept.status_code == 503 and error_code(kept) == "state_unavailable", kept.text
            assert stack.receipt(kept.headers["x-request-id"])["error_code"] == "state_unavailable"

            ready = httpx.get(f"{stack.url}/readyz")
            assert ready.status_code == 200
            assert ready.json()["degraded"] == ["state_volume_full"]
            assert stack.sim.requests()  # what needs no state is still served:
            with stack.client() as client:
                assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200

            free(vol)
            # Room again, but the volume is only known to be fine once a write succeeds.
            assert httpx.get(f"{stack.url}/readyz").json()["degraded"] == ["state_volume_full"]
            assert upload(stack, WAV, "audio/wav", tenant="globex").status_code == 201
            assert "degraded" not in httpx.get(f"{stack.url}/readyz").json()


def test_state_and_evidence_files_are_never_world_readable(tmp_path: Path) -> None:
    """Evidence 0440, state files 0600 (spec §24): the catalog holds kept prompts."""
    endpoints = ["chat.completions", "responses", "models", "evidence"]
    with running_stack(tmp_path, acme={"endpoints": endpoints}) as stack:
        record = staged(stack, PNG, "image/png")
        with stack.client() as client:
            kept = client.post("/v1/responses", json={"model": "gemma-4-mm", "input": "secret"})
        assert kept.status_code == 200
        staging = stack.runtime.config.staging
        catalog = Path(staging.catalog)
        evidence = Path(staging.dir) / f"{record['sha256']}.png"
        assert evidence.stat().st_mode & 0o777 == 0o440
        state_files = [p for p in catalog.parent.iterdir() if p.name.startswith(catalog.name)]
        assert {p.name for p in state_files} >= {
            catalog.name,
            catalog.name + "-wal",
            catalog.name + "-shm",
            catalog.name + ".reserve",
        }
        for path in state_files:
            assert path.stat().st_mode & 0o777 == 0o600, path.name
        for path in Path(staging.dir).iterdir():
            assert path.stat().st_mode & 0o007 == 0, path.name
        assert Path(staging.dir).stat().st_mode & 0o007 == 0


def test_an_older_catalog_left_readable_is_tightened_at_start(tmp_path: Path) -> None:
    catalog = tmp_path / "var" / "catalog.sqlite3"
    with running_stack(tmp_path):
        pass
    for path in (catalog, catalog.with_name(catalog.name + "-wal")):
        if path.exists():
            path.chmod(0o644)
    with running_stack(tmp_path):
        assert catalog.stat().st_mode & 0o777 == 0o600


# -- media read only after admission ----------------------------------------------


def _bytes_read(stack: Stack) -> int:
    read: int = stack.runtime.evidence.store.bytes_read
    return read


def test_media_is_read_only_after_admission(tmp_path: Path) -> None:
    size = 19 * 1024 * 1024
    acme = {
        "limits": {**BASE_LIMITS, "max_media_parts": 4, "max_media_bytes": 20_000_000},
        "admission": {"share": 1, "max_permits": 4, "queue_timeout_s": 0.5},
    }
    # Two units: the text stream holds one, the media request needs both (base + image).
    admission = {"capacity": 2, "max_queue": 8}
    with running_stack(tmp_path, acme=acme, admission=admission) as stack:
        data = big_png(size)
        record = staged(stack, data, "image/png")
        part = media_part("image", f"evidence:{record['id']}")
        before = _bytes_read(stack)
        # Four times a 19 MiB record passes 20 MB: refused from the catalog record alone.
        refused = chat(stack, multimodal(part, part, part, part))
        assert refused.status_code == 400 and error_code(refused) == "media_limit_exceeded"
        assert _bytes_read(stack) == before
        # A slow text stream holds a unit: the media request times out queued.
        slow = chat_body("hold [[sim chunks=30 delay_ms=100]]", stream=True)
        with (
            stack.client(timeout=30) as client,
            client.stream("POST", "/v1/chat/completions", json=slow) as holding,
        ):
            assert holding.status_code == 200
            queued = chat(stack, multimodal(part))
            assert queued.status_code == 429 and error_code(queued) == "admission_timeout"
            assert _bytes_read(stack) == before, "a request that never got its permit read nothing"
            holding.read()
        posts = len(worker_posts(stack.sim))
        admitted = chat(stack, multimodal(part, stream=False))
        assert admitted.status_code == 200
        assert _bytes_read(stack) == before + size
        sent = worker_posts(stack.sim)[posts:]
        assert len(sent) == 1
        mime, payload = decoded(url_of(worker_parts(sent[0])[0]))
        assert (mime, sha(payload)) == ("image/png", record["sha256"])
        receipt = stack.receipt(admitted.headers["x-request-id"])
        assert receipt["request_bytes"] == len(sent[0].body)
        assert receipt["request_sha256"] == sha(sent[0].body)


def test_a_repeated_id_is_looked_up_once_and_verified_on_every_pass(stack: Stack) -> None:
    record = staged(stack, WAV, "audio/wav")
    part = media_part("audio", f"evidence:{record['id']}")
    before = _bytes_read(stack)
    response = chat(stack, multimodal(part, part, stream=False))
    assert response.status_code == 200
    # One lease and one open file; each occurrence streamed (and hashed) from it.
    assert _bytes_read(stack) - before == 2 * len(WAV)
    parts = worker_parts(worker_posts(stack.sim)[-1])
    assert [decoded(url_of(p))[1] for p in parts[:2]] == [WAV, WAV]
    receipt = stack.receipt(response.headers["x-request-id"])
    assert [a["evidence_id"] for a in receipt["artifacts"]] == [record["id"], record["id"]]


def test_a_file_changed_on_disk_never_reaches_the_worker_whole(stack: Stack) -> None:
    record = staged(stack, WAV, "audio/wav")
    path = Path(stack.runtime.config.staging.dir) / f"{record['sha256']}.wav"
    path.chmod(0o644)
    with path.open("r+b") as handle:
        handle.seek(len(WAV) - 1)
        handle.write(b"\x01" if WAV[-1:] != b"\x01" else b"\x02")
    posts = len(worker_posts(stack.sim))
    response = chat(stack, multimodal(media_part("audio", f"evidence:{record['id']}")))
    assert response.status_code == 500 and error_code(response) == "storage_error"
    assert len(worker_posts(stack.sim)) == posts, "the truncated body was never a request"
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["request_sha256"] is None and receipt["error_code"] == "storage_error"
    assert no_leases(stack)


# -- pixels, not only bytes (spec §24) ------------------------------------------


def test_pixel_bombs_are_refused_before_they_are_kept_or_forwarded(tmp_path: Path) -> None:
    acme = {"media": {"caller_urls": "reject", "inline_data": "stage"}}
    staging = {**STAGING, "max_image_side": 4096, "max_image_pixels": 4_000_000}
    with running_stack(tmp_path, acme=acme, staging=staging) as stack:
        bomb = pixels.png_bomb()  # 60000 x 60000 declared, a few tens of KB sent
        for data, media_type in (
            (bomb, "image/png"),
            (pixels.jpeg(4097, 10, app_bytes=100_000), "image/jpeg"),
            (pixels.webp_vp8x(2001, 2000), "image/webp"),  # under the side, over the pixels
            (pixels.mp4(640, 480, coded=(8192, 8192)), "video/mp4"),
        ):
            refused = upload(stack, data, media_type)
            assert refused.status_code == 400, media_type
            assert error_code(refused) == "media_limit_exceeded"
            assert "pixels" in refused.json()["error"]["message"]
        assert files_in(stack) == set() and records_of(stack) == 0
        # At the bounds it is served.
        for data, media_type in (
            (pixels.png(4096, 976), "image/png"),
            (pixels.gif(2000, 2000), "image/gif"),
            (pixels.mp4(1920, 1080), "video/mp4"),
        ):
            assert upload(stack, data, media_type).status_code == 201, media_type

        # Inline data staged after admission: the same bound, and the worker sees nothing.
        inline = "data:image/png;base64," + base64.b64encode(bomb).decode()
        response = chat(stack, multimodal(media_part("image", inline)))
        assert response.status_code == 400 and error_code(response) == "media_limit_exceeded"
        assert worker_posts(stack.sim) == []
        assert no_leases(stack)


def test_the_default_bounds_take_a_large_photo_and_refuse_the_bomb(stack: Stack) -> None:
    assert upload(stack, pixels.jpeg(8000, 5000), "image/jpeg").status_code == 201
    bomb = upload(stack, pixels.png_bomb(), "image/png")
    assert bomb.status_code == 400 and error_code(bomb) == "media_limit_exceeded"
