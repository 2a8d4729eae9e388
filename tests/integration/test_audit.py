"""Receipts never fail open (spec §13), through the real gateway on a real full disk.

The audit file sits on a small tmpfs; the test fills it with a real file,
watches the gateway stop taking new work without touching the worker, frees
the space and watches receipts come back by themselves.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from gateway.testing.harness import read_receipts
from gateway.testing.samples import SAMPLES
from tests.support.poll import eventually
from tests.support.process import metric, serve, sim_running
from tests.support.stack import chat_body, issuers, policies, running_stack, worker_posts
from tests.support.tmpfs import fill, free, small_fs


def requests_until_audit_fails(client: httpx.Client) -> list[httpx.Response]:
    """Inference requests on a full audit disk, until the writer has failed.

    They are served until then (the receipts file's last page may still take a
    line or two); their receipts wait in memory."""
    served = []
    for i in range(40):
        response = client.post("/v1/chat/completions", json=chat_body(f"on a full disk {i}"))
        assert response.status_code == 200
        served.append(response)
        if eventually(lambda: client.get("/readyz").status_code == 503, 0.3):
            return served
    raise AssertionError("the receipt writer never reported the full disk")


def test_a_full_audit_disk_stops_new_work_and_receipts_resume(tmp_path: Path) -> None:
    with small_fs(tmp_path / "audit", 256) as fs:
        path = fs / "receipts.jsonl"
        with running_stack(tmp_path / "gw", audit={"path": str(path)}) as stack:
            with stack.client(timeout=10) as client:
                upload = client.post(
                    "/v1/evidence",
                    content=SAMPLES["tiny.png"](),
                    headers={"content-type": "image/png"},
                )
                assert upload.status_code == 201
                first = client.post("/v1/chat/completions", json=chat_body("one"))
                assert first.status_code == 200
                stack.receipt(first.headers["x-request-id"])
                fill(fs)
                served = requests_until_audit_fails(client)
                ready = client.get("/readyz").json()
                assert ready["status"] == "not_ready" and ready["reason"] == "audit_unavailable"
                posts = len(worker_posts(stack.sim))
                refused = client.post("/v1/chat/completions", json=chat_body("three"))
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == "audit_unavailable"
                assert len(worker_posts(stack.sim)) == posts, "nothing reached the worker"
                blocked = client.post(
                    "/v1/evidence",
                    content=SAMPLES["tiny.png"](),
                    headers={"content-type": "image/png"},
                )
                assert blocked.json()["error"]["code"] == "audit_unavailable"
                # Reads and deletes stay served: a tenant can still free space.
                evidence_id = upload.json()["id"]
                assert client.get(f"/v1/evidence/{evidence_id}").status_code == 200
                assert client.delete(f"/v1/evidence/{evidence_id}").status_code == 204
                assert stack.metric("gateway_receipt_errors_total") > 0
                assert stack.metric("gateway_receipts_pending") >= 1
                free(fs)
                assert eventually(lambda: client.get("/readyz").status_code == 200, 15)
                again = client.post("/v1/chat/completions", json=chat_body("four"))
                assert again.status_code == 200
                for response in (*served, refused, again):
                    stack.receipt(response.headers["x-request-id"])
            receipts = {r["request_id"]: r for r in stack.receipts()}
            assert receipts[refused.headers["x-request-id"]]["error_code"] == "audit_unavailable"
            assert all(receipts[r.headers["x-request-id"]]["outcome"] == "complete" for r in served)
            assert stack.metric("gateway_receipts_lost_total") == 0


def test_sigterm_with_a_full_audit_disk_exits_within_its_bounds(tmp_path: Path) -> None:
    grace, flush = 1.0, 1.0
    with small_fs(tmp_path / "audit", 256) as fs, sim_running() as sim:
        from gateway.testing.harness import write_config

        config = write_config(
            tmp_path,
            upstream_port=sim.port,
            policies=policies(),
            issuers=issuers(),
            listen={"host": "127.0.0.1", "port": 0, "shutdown_grace_s": grace},
            audit={"path": str(fs / "receipts.jsonl"), "flush_timeout_s": flush},
        )
        with serve(config, tmp_path) as served:
            headers = {"authorization": f"Bearer {served.dev_token()}"}
            with httpx.Client(base_url=served.url, headers=headers, timeout=10) as client:
                assert eventually(lambda: client.get("/readyz").status_code == 200, 10)
                fill(fs)
                requests_until_audit_fails(client)
                assert metric(client, "gateway_receipt_errors_total") > 0
            sent = time.monotonic()
            served.signal(signal.SIGTERM)
            # The bound under test (grace + flush), plus process start-up slack.
            served.proc.wait(grace + flush + 5)
            elapsed = time.monotonic() - sent
            assert served.proc.returncode == 0
            stderr = served.stderr_text()
            assert "could not be written" in stderr
            assert str(fs) not in stderr, "logs name no paths"
        print(f"SIGTERM to exit with a full audit disk: {elapsed:.2f} s (bound {grace + flush} s)")
        assert read_receipts(fs / "receipts.jsonl") is not None
