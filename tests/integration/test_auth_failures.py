"""Why authentication failed, for operators only: a real ``serve`` process.

Every reason of ``gateway.auth.failures.REASONS`` is provoked once: the
caller gets the generic 401 body, the operator gets one ``gateway.auth`` log
line with the reason and the request id, and
``gateway_auth_failures_total{reason}`` counts it.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import jwt
import orjson

from gateway.auth.failures import REASONS
from gateway.testing.harness import write_config
from tests.support.jwt import make_claims, private_key, sign_rs256
from tests.support.process import metric, serve, sim_running, wait_ready
from tests.support.stack import chat_body, issuers, policies


def _credentials() -> dict[str, str | None]:
    """reason -> the Authorization header that provokes it (None: no header)."""
    now = time.time()
    return {
        "missing": None,
        "malformed": "Bearer aaaa.bbbb.cccc",
        "unknown_api_key": "Bearer sk-nobody-has-this-key-0123456789",
        "issuer": "Bearer " + sign_rs256(make_claims(iss="https://elsewhere.test")),
        "algorithm": "Bearer "
        + jwt.encode(make_claims(), private_key("rsa1"), algorithm="RS512", headers={"kid": "k1"}),
        "unknown_kid": "Bearer " + sign_rs256(make_claims(), kid="no-such-kid"),
        "signature": "Bearer " + sign_rs256(make_claims(), kid="k1", key="rsa2"),
        "audience": "Bearer " + sign_rs256(make_claims(aud="someone-else")),
        "expired": "Bearer " + sign_rs256(make_claims(now=now - 4000)),
        "not_yet_valid": "Bearer " + sign_rs256(make_claims(nbf=int(now) + 3600)),
        "lifetime": "Bearer " + sign_rs256(make_claims(ttl=7200)),
        "missing_claim": "Bearer " + sign_rs256(make_claims(tenant=None)),
    }


def test_each_reason_is_logged_and_counted_but_never_told_the_caller(tmp_path: Path) -> None:
    credentials = _credentials()
    assert set(credentials) == set(REASONS)
    with sim_running() as sim:
        config = write_config(
            tmp_path, upstream_port=sim.port, policies=policies(), issuers=issuers()
        )
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)
            bodies = {}
            for index, (reason, header) in enumerate(credentials.items()):
                headers = {"x-request-id": f"auth-fail-{index}"}
                if header is not None:
                    headers["authorization"] = header
                # Inference and a small route share the one counting point.
                if index % 2:
                    response = client.get("/v1/models", headers=headers)
                else:
                    response = client.post(
                        "/v1/chat/completions", json=chat_body(), headers=headers
                    )
                assert response.status_code == 401, reason
                bodies[reason] = response.json()
                if reason != "missing":  # its generic code is missing_credentials
                    assert reason not in response.text
                assert not any(reason in value for value in response.headers.values())
            counts = {r: metric(client, "gateway_auth_failures_total", reason=r) for r in REASONS}
            assert client.get("/livez").status_code == 200
        stderr = gw.stderr_text()

    assert counts == dict.fromkeys(REASONS, 1.0)
    expected = {
        "error": {
            "message": "The credential is not valid.",
            "type": "authentication_error",
            "code": "invalid_token",
            "param": None,
        }
    }
    for reason, body in bodies.items():
        if reason == "missing":
            assert body["error"]["code"] == "missing_credentials"
        else:
            assert body == expected, reason
    entries = [orjson.loads(line) for line in stderr.splitlines() if line.strip()]
    auth_lines = [e for e in entries if e.get("logger") == "gateway.auth"]
    assert len(auth_lines) == len(REASONS)
    for index, reason in enumerate(credentials):
        [line] = [e for e in auth_lines if e["request_id"] == f"auth-fail-{index}"]
        assert line["reason"] == reason
        assert line["level"] in ("info", "warning")
        assert line["msg"] == f"authentication failed: {reason}"
    # No credential or claim value reaches the log.
    for header in filter(None, credentials.values()):
        for part in header.removeprefix("Bearer ").split("."):
            if len(part) > 8:
                assert part not in stderr
    for claim_value in ("someone-else", "https://elsewhere.test", "no-such-kid"):
        assert claim_value not in stderr
