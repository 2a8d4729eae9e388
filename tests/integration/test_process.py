"""The real ``mistralrs-gateway serve`` process: TLS, logs and signals (spec §3, §11).

Each test starts ``python -m gateway.tools.cli serve --port 0`` as a subprocess in
front of an in-thread simulator, reads the port from the one stdout line,
and kills the process (by its PID) in a ``finally`` if it is still running.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trustme
import yaml

from gateway.testing.harness import SIM_ROUTE, read_receipts, write_config
from gateway.testing.simulator import Simulator
from tests.support import rawhttp
from tests.support.jwt import (
    JWKS_PATH,
    JWKS_ROTATED_PATH,
    make_claims,
    sign_rs256,
)
from tests.support.process import (
    metric,
    serve,
    sim_running,
    wait_ready,
    wait_until,
)
from tests.support.stack import chat_body, issuers, policies, sse_data, worker_posts


def rs256(kid: str = "k1", key: str = "rsa1") -> str:
    return sign_rs256(make_claims(), kid=kid, key=key)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _config(tmp: Path, sim: Simulator, **sections: Any) -> Path:
    return write_config(
        tmp, upstream_port=sim.port, policies=policies(), issuers=issuers(), **sections
    )


def _listen(**extra: Any) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 5, **extra}


# ------------------------------------------------------------------- TLS


@dataclass
class Pki:
    ca: trustme.CA
    server_cert: Path
    server_key: Path
    ca_file: Path

    def client_context(self, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if client is not None:
            client.configure_cert(context)
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    tls = tmp_path / "tls"
    tls.mkdir()
    cert, key, ca_file = tls / "tls.crt", tls / "tls.key", tls / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(ca_file))
    return Pki(ca, cert, key, ca_file)


def test_https_with_a_private_ca(tmp_path: Path, pki: Pki) -> None:
    with sim_running() as sim:
        tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
        config = _config(tmp_path, sim, listen=_listen(tls=tls))
        with (
            serve(config, tmp_path) as gw,
            httpx.Client(base_url=gw.url, verify=pki.client_context()) as client,
        ):
            assert gw.url.startswith("https://")
            wait_ready(client)
            response = client.post(
                "/v1/chat/completions", json=chat_body(stream=True), headers=bearer(rs256())
            )
            assert response.status_code == 200
            assert sse_data(response.text)[-1] == "[DONE]"
            # A client that does not trust the private CA cannot talk to it.
            with (
                httpx.Client(base_url=gw.url) as untrusting,
                pytest.raises(httpx.ConnectError),
            ):
                untrusting.get("/livez")


def test_mtls_requires_a_client_certificate(tmp_path: Path, pki: Pki) -> None:
    tls = {
        "certfile": str(pki.server_cert),
        "keyfile": str(pki.server_key),
        "client_ca": str(pki.ca_file),
    }
    good_client = pki.ca.issue_cert("product-service@example.internal")
    stranger_client = trustme.CA().issue_cert("product-service@example.internal")
    with sim_running() as sim:
        config = _config(tmp_path, sim, listen=_listen(tls=tls))
        with serve(config, tmp_path) as gw:
            # TLS 1.3 lets the client finish its handshake before the server's
            # refusal arrives, so the failure may surface on the first read.
            for context in (pki.client_context(), pki.client_context(stranger_client)):
                with (
                    httpx.Client(base_url=gw.url, verify=context) as refused,
                    pytest.raises(httpx.TransportError),
                ):
                    refused.get("/livez")
            with httpx.Client(base_url=gw.url, verify=pki.client_context(good_client)) as client:
                wait_ready(client)
                response = client.post(
                    "/v1/chat/completions", json=chat_body(), headers=bearer(gw.dev_token())
                )
                assert response.status_code == 200
                assert response.json()["choices"][0]["finish_reason"] == "stop"
            assert gw.proc.poll() is None


# ------------------------------------------------------------------- logs

_ACCESS_KEYS = ("request_id", "tenant", "route", "status", "outcome", "duration_ms")


def test_one_json_access_line_per_request_and_no_secrets(tmp_path: Path) -> None:
    prompt = "confidential-prompt-" + secrets.token_hex(8)
    bogus = "sk-not-a-real-key-" + secrets.token_hex(16)
    with sim_running() as sim:
        config = _config(tmp_path, sim)
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)
            token = gw.dev_token()
            calls: list[tuple[str, int, str, str | None]] = [
                # (request id, status, tenant, outcome)
                ("log-ok-1", 200, "acme", "complete"),
                ("log-unauth-2", 401, "-", None),
                ("log-url-3", 400, "acme", "rejected"),
                ("log-live-4", 200, "-", None),
            ]
            ok = client.post(
                "/v1/chat/completions",
                json=chat_body(prompt, stream=True),
                headers={**bearer(token), "x-request-id": "log-ok-1"},
            )
            assert ok.status_code == 200
            unauth = client.post(
                "/v1/chat/completions",
                json=chat_body(prompt),
                headers={**bearer(bogus), "x-request-id": "log-unauth-2"},
            )
            assert unauth.status_code == 401
            content: list[dict[str, Any]] = [
                {"type": "text", "text": prompt},
                {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
            ]
            url = client.post(
                "/v1/chat/completions",
                json=chat_body(messages=[{"role": "user", "content": content}]),
                headers={**bearer(token), "x-request-id": "log-url-3"},
            )
            assert url.json()["error"]["code"] == "caller_url_forbidden"
            assert client.get("/livez", headers={"x-request-id": "log-live-4"}).status_code == 200
            gw.signal(signal.SIGTERM)
            assert gw.proc.wait(10) == 0
        stderr = gw.stderr_text()

    entries = [orjson.loads(line) for line in stderr.splitlines() if line.strip()]
    access = [e for e in entries if e.get("logger") == "gateway.access"]
    # Worker calls (readiness polls, forwarded requests) are not logged line by line.
    assert not [e for e in entries if e["logger"].startswith(("httpx", "httpcore"))]
    for request_id, status, tenant, outcome in calls:
        lines = [e for e in access if e.get("request_id") == request_id]
        assert len(lines) == 1, request_id
        line = lines[0]
        assert set(_ACCESS_KEYS) <= set(line), line
        assert (line["status"], line["tenant"], line["outcome"]) == (status, tenant, outcome)
        assert isinstance(line["duration_ms"], int | float)
    assert [e["route"] for e in access if e["request_id"].startswith("log-")] == [
        "chat.completions",
        "chat.completions",
        "chat.completions",
        "health",
    ]
    for secret in (token, bogus, prompt, "/etc/passwd", str(tmp_path), "sim-token-"):
        assert secret not in stderr


# ----------------------------------------------------------------- SIGHUP


def _copy_jwks(tmp: Path) -> tuple[Path, list[dict[str, Any]]]:
    jwks = tmp / "keys" / "jwks.json"
    jwks.parent.mkdir()
    shutil.copyfile(JWKS_PATH, jwks)
    configured = issuers()
    configured[0]["jwks_file"] = str(jwks)
    return jwks, configured


def _swap_file(path: Path, source: Path) -> None:
    """Replace ``path``'s content atomically, as a ConfigMap/Secret update does."""
    staged = path.with_suffix(".new")
    shutil.copyfile(source, staged)
    staged.replace(path)


def test_sighup_reloads_policies_and_keys(tmp_path: Path) -> None:
    jwks, configured = _copy_jwks(tmp_path)
    with sim_running() as sim:
        config = write_config(
            tmp_path, upstream_port=sim.port, policies=policies(), issuers=configured
        )
        acme_file = tmp_path / "policies" / "acme.yaml"
        acme = yaml.safe_load(acme_file.read_text())
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)

            def chat(alias: str, token: str) -> httpx.Response:
                body = chat_body(model=alias)
                return client.post("/v1/chat/completions", json=body, headers=bearer(token))

            assert chat("gemma-4-mm", rs256()).status_code == 200
            assert chat("gemma-next", rs256()).status_code == 404

            # 1. A broken policy (an unknown key) is refused; the old set keeps serving.
            new_models = {**acme["models"], "gemma-next": SIM_ROUTE}
            acme_file.write_text(yaml.safe_dump({**acme, "models": new_models, "colour": "red"}))
            gw.signal(signal.SIGHUP)
            wait_until(
                lambda: metric(client, "gateway_reloads_total", result="refused") == 1,
                5,
                "reload refused",
            )
            assert metric(client, "gateway_reloads_total", result="applied") == 0
            assert chat("gemma-4-mm", rs256()).status_code == 200
            refused = chat("gemma-next", rs256())
            assert refused.json()["error"]["code"] == "model_not_found"

            # 2. A valid change (a new alias) is applied.
            acme_file.write_text(yaml.safe_dump({**acme, "models": new_models}))
            gw.signal(signal.SIGHUP)
            wait_until(
                lambda: metric(client, "gateway_reloads_total", result="applied") == 1,
                5,
                "reload applied",
            )
            assert chat("gemma-next", rs256()).status_code == 200

            # 3. A rotated JWKS file: k2 works, k1 (removed from the file) stops.
            k1 = rs256()
            assert chat("gemma-4-mm", k1).status_code == 200  # now in the verified cache
            _swap_file(jwks, JWKS_ROTATED_PATH)
            gw.signal(signal.SIGHUP)
            wait_until(
                lambda: metric(client, "gateway_reloads_total", result="applied") == 2,
                5,
                "key reload applied",
            )
            assert chat("gemma-4-mm", rs256("k2", "rsa2")).status_code == 200
            stale = chat("gemma-4-mm", k1)
            assert stale.status_code == 401
            assert stale.json()["error"]["code"] == "invalid_token"
            assert metric(client, "gateway_reloads_total", result="refused") == 1

            # 4. An unreadable JWKS file is refused too; the keys in use stay.
            jwks.write_text("{not json")
            gw.signal(signal.SIGHUP)
            wait_until(
                lambda: metric(client, "gateway_reloads_total", result="refused") == 2,
                5,
                "broken key file refused",
            )
            assert chat("gemma-next", rs256("k2", "rsa2")).status_code == 200
            assert metric(client, "gateway_reloads_total", result="applied") == 2
            assert gw.proc.poll() is None
        assert "reload refused" in gw.stderr_text()


def test_unknown_kid_rereads_the_jwks_file_without_sighup(tmp_path: Path) -> None:
    jwks, configured = _copy_jwks(tmp_path)
    with sim_running() as sim:
        config = write_config(
            tmp_path, upstream_port=sim.port, policies=policies(), issuers=configured
        )
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)

            def status(token: str) -> int:
                body = chat_body()
                return client.post(
                    "/v1/chat/completions", json=body, headers=bearer(token)
                ).status_code

            assert status(rs256()) == 200
            _swap_file(jwks, JWKS_ROTATED_PATH)
            # k2 is unknown: one re-read of the issuer's file finds it.
            assert status(rs256("k2", "rsa2")) == 200
            # k1 left the file with that re-read; its re-read now is rate-limited.
            assert status(rs256()) == 401
            refreshed_at = time.monotonic()
            _swap_file(jwks, JWKS_PATH)
            assert status(rs256()) == 401  # within 2 s of the last re-read: not re-read
            wait_until(lambda: status(rs256()) == 200, 5, "k1 accepted after the interval")
            assert time.monotonic() - refreshed_at >= 1.5
            assert metric(client, "gateway_reloads_total", result="applied") == 0


# ---------------------------------------------------------------- SIGTERM


@dataclass
class StreamResult:
    status: int = 0
    data: list[str] = field(default_factory=list)
    ended_at: float = 0.0
    error: BaseException | None = None


def _stream_in_thread(
    url: str, token: str, prompt: str, request_id: str, *, stream: bool = True
) -> tuple[threading.Thread, StreamResult]:
    result = StreamResult()

    def run() -> None:
        try:
            headers = {**bearer(token), "x-request-id": request_id}
            with (
                httpx.Client(base_url=url, timeout=30) as client,
                client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json=chat_body(prompt, stream=stream),
                    headers=headers,
                ) as response,
            ):
                result.status = response.status_code
                text = "".join(response.iter_text())
            result.data = sse_data(text) if stream else [text]
        except BaseException as exc:  # reported by the test thread
            result.error = exc
        finally:
            result.ended_at = time.monotonic()

    thread = threading.Thread(target=run, name=request_id, daemon=True)
    thread.start()
    return thread, result


def test_sigterm_drains_then_exits_zero(tmp_path: Path) -> None:
    with sim_running() as sim:
        config = _config(tmp_path, sim, listen=_listen(shutdown_grace_s=1.5))
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)
            token = gw.dev_token()
            short_thread, short = _stream_in_thread(
                gw.url, token, "[[sim chunks=8 delay_ms=100]]", "drain-short"
            )
            long_thread, long = _stream_in_thread(
                gw.url, token, "[[sim chunks=100 delay_ms=100]]", "drain-long"
            )
            # Not streamed to the caller: past the grace it gets a 502 instead.
            blocking_thread, blocking = _stream_in_thread(
                gw.url, token, "[[sim chunks=100 delay_ms=100]]", "drain-blocking", stream=False
            )
            threads = (short_thread, long_thread, blocking_thread)
            assert sim.wait_for(lambda: sim.active_streams == 3, 5)
            sigterm_at = time.monotonic()
            gw.signal(signal.SIGTERM)

            wait_until(lambda: client.get("/readyz").status_code == 503, 1, "/readyz 503")
            ready = client.get("/readyz").json()
            assert (ready["status"], ready["draining"]) == ("not_ready", True)
            # Draining, not a worker problem: the route itself stays ready.
            assert ready["routes"][SIM_ROUTE] == {
                "upstream": "default",
                "ready": True,
                "reason": None,
            }
            assert client.get("/livez").status_code == 200
            late = client.post(
                "/v1/chat/completions",
                json=chat_body(),
                headers={**bearer(token), "x-request-id": "drain-late"},
            )
            assert late.status_code == 503
            assert late.json()["error"]["code"] == "upstream_not_ready"
            assert len(worker_posts(sim)) == 3

            for thread in threads:
                thread.join(10)
            assert not any(thread.is_alive() for thread in threads)
            assert short.error is None and long.error is None and blocking.error is None
            assert gw.proc.wait(10) == 0
            exited_at = time.monotonic()

    assert short.status == 200
    assert short.data[-1] == "[DONE]"
    assert short.ended_at > sigterm_at  # it was in flight during the drain
    assert long.status == 200
    assert "[DONE]" not in long.data
    last = orjson.loads(long.data[-1])
    assert last["error"]["code"] == "upstream_unavailable"
    assert 1.4 <= long.ended_at - sigterm_at < 5  # cut at the grace, not before
    assert exited_at - sigterm_at < 8
    assert blocking.status == 502
    assert orjson.loads(blocking.data[0])["error"]["code"] == "upstream_unavailable"

    path = gw.receipts_path()
    by_id = {r["request_id"]: r for r in read_receipts(path)}
    assert by_id["drain-short"]["outcome"] == "complete"
    assert by_id["drain-long"]["outcome"] == "incomplete"
    assert by_id["drain-long"]["error_code"] == "upstream_unavailable"
    assert by_id["drain-blocking"]["outcome"] == "incomplete"
    assert (by_id["drain-late"]["outcome"], by_id["drain-late"]["error_code"]) == (
        "rejected",
        "upstream_not_ready",
    )


def test_drain_cut_stream_logs_its_error_code(tmp_path: Path) -> None:
    with sim_running() as sim:
        config = _config(tmp_path, sim, listen=_listen(shutdown_grace_s=0.2))
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)
            thread, cut = _stream_in_thread(
                gw.url, gw.dev_token(), "[[sim chunks=100 delay_ms=100]]", "drain-logged"
            )
            assert sim.wait_for(lambda: sim.active_streams == 1, 5)
            gw.signal(signal.SIGTERM)
            thread.join(10)
            assert gw.proc.wait(10) == 0
        stderr = gw.stderr_text()
    assert orjson.loads(cut.data[-1])["error"]["code"] == "upstream_unavailable"
    lines = [orjson.loads(line) for line in stderr.splitlines() if "drain-logged" in line]
    assert [(e["outcome"], e["error_code"]) for e in lines] == [
        ("incomplete", "upstream_unavailable")
    ]


def test_drain_ends_a_request_still_sending_its_body(tmp_path: Path) -> None:
    """A caller trickling its body does not hold the drain past the grace."""
    with sim_running() as sim:
        listen = _listen(shutdown_grace_s=0.3, body_timeout_s=60)
        config = _config(tmp_path, sim, listen=listen)
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)
            body = orjson.dumps(chat_body())
            port = int(gw.url.rsplit(":", 1)[1])
            sock = rawhttp.connect(port)
            try:
                sock.sendall(
                    rawhttp.chat_post(
                        gw.dev_token(),
                        [("content-length", str(len(body))), ("x-request-id", "drain-body")],
                        content_length=False,
                    )
                    + body[:5]
                )
                # Its head was in before this answer left (one event loop, in
                # order): by now the request is waiting for the rest of its body.
                assert client.get("/livez").status_code == 200
                sigterm_at = time.monotonic()
                gw.signal(signal.SIGTERM)
                response = rawhttp.read_response(sock, timeout_s=10)
            finally:
                sock.close()
            assert gw.proc.wait(10) == 0
            exited_at = time.monotonic()
    assert response.status == 502
    assert response.error_code() == "upstream_unavailable"
    assert exited_at - sigterm_at < 8  # the body timeout (60 s) did not decide it
    receipt = {r["request_id"]: r for r in read_receipts(gw.receipts_path())}["drain-body"]
    assert (receipt["outcome"], receipt["error_code"]) == ("incomplete", "upstream_unavailable")
    assert len(worker_posts(sim)) == 0
