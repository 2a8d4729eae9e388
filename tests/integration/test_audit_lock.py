"""Two real gateways cannot share one audit path (spec §13, §17, §24): the
second refuses to start with one line naming ``audit.path``, the first's
receipts stay one chain, and a killed holder's lock goes with its process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.testing.harness import DEMO_SECRET_ENV, wait_receipt, write_config
from gateway.tools.cli import main
from tests.support.jwt import HS_SECRET
from tests.support.process import REPO, START_TIMEOUT_S, Served, serve, sim_running, wait_ready
from tests.support.stack import chat_body, issuers, policies

_HELD = (
    "held by another gateway process: one writer per audit file "
    "(give each replica its own audit.path)"
)


def _one_receipt(served: Served, audit: Path) -> dict[str, object]:
    headers = {"authorization": f"Bearer {served.dev_token()}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=10) as client:
        wait_ready(client, 10)
        response = client.post("/v1/chat/completions", json=chat_body("chained"))
        assert response.status_code == 200
    return wait_receipt(audit, response.headers["x-request-id"], 10)


def test_a_second_gateway_on_one_audit_path_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = tmp_path / "audit" / "receipts.jsonl"
    with sim_running() as sim:
        first, second = (
            write_config(
                tmp_path / name,
                upstream_port=sim.port,
                policies=policies(),
                issuers=issuers(),
                audit={"path": str(audit)},
                state={"replica_id": name},
            )
            for name in ("gw-a", "gw-b")
        )
        with serve(first, first.parent) as served:
            receipt = _one_receipt(served, audit)
            # Its open line (write-ahead, spec §24) is seq 1, the receipt names it.
            assert (receipt["replica"], receipt["seq"], receipt["open_seq"]) == ("gw-a", 2, 1)
            env = {**os.environ, DEMO_SECRET_ENV: HS_SECRET}
            env.pop("GATEWAY_LOG_LEVEL", None)
            argv = ["-m", "gateway.tools.cli", "serve", "--config", str(second), "--port", "0"]
            refused = subprocess.run(
                [sys.executable, *argv],
                cwd=REPO,
                env=env,
                capture_output=True,
                timeout=START_TIMEOUT_S,
                check=False,
            )
            assert refused.returncode == 1
            assert refused.stdout == b"", "it never listened"
            stderr = refused.stderr.decode()
            # Refused before it starts, naming the config key it conflicts on (spec §24).
            assert stderr.splitlines() == [f"error: audit.path: {_HELD}"], stderr
            assert "Traceback" not in stderr and str(tmp_path) not in stderr
            assert _one_receipt(served, audit)["seq"] == 4, "the first one serves on"
        # Killed (not drained): its lock went with the process.
        with serve(second, second.parent) as served:
            receipt = _one_receipt(served, audit)
            assert (receipt["replica"], receipt["seq"]) == ("gw-b", 2)
            served.terminate()
    capsys.readouterr()
    assert main(["receipts", "verify", str(audit.parent)]) == 0
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith("2 replicas, 3 receipts, 0 findings; 3 open lines (write-ahead)")
    )
