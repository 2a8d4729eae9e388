"""Write-ahead receipts and chain anchors through a real ``serve`` process
(spec §24): a SIGKILLed replica's requests in flight are visible to ``receipts
verify`` as ``unfinished``, and deleting a replica's newest receipt lines is
found against the anchor it recorded in its state store."""

from __future__ import annotations

import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.books.receipt_chain import Anchor
from gateway.books.state.sqlite.anchors import SqliteAnchorStore
from gateway.config.loader import load_config
from gateway.testing.harness import read_open_lines, read_receipts, write_config
from gateway.tools.cli import main
from tests.support.poll import eventually
from tests.support.process import Served, metric, serve, sim_running, wait_ready
from tests.support.stack import chat_body, issuers, policies

#: a stream that stays before its first event until its caller (or its replica) goes
HANG = "[[sim first_delay_ms=120000 keepalive_ms=0]]"


def _config(tmp_path: Path, port: int, replica: str) -> Path:
    return write_config(
        tmp_path,
        upstream_port=port,
        policies=policies(),
        issuers=issuers(),
        audit={"path": f"var/{replica}/receipts.jsonl", "anchor_interval_s": 0.2},
        state={"replica_id": replica},
    )


def _client(served: Served, **headers: str) -> httpx.Client:
    auth = {"authorization": f"Bearer {served.dev_token()}", **headers}
    return httpx.Client(base_url=served.url, headers=auth, timeout=httpx.Timeout(30, connect=5))


def _hang(served: Served, request_id: str) -> str:
    """A streamed request that never ends by itself; how it ended for the caller."""
    with _client(served, **{"x-request-id": request_id}) as client:
        try:
            with client.stream(
                "POST", "/v1/chat/completions", json=chat_body(HANG, stream=True)
            ) as response:
                response.read()
        except httpx.HTTPError as exc:
            return type(exc).__name__
    return "ended"


def test_a_sigkilled_replicas_requests_in_flight_are_unfinished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sim_running() as sim:
        config = _config(tmp_path, sim.port, "gw-k")
        audit = load_config(config).audit.path
        hanging = [f"hang-{n}" for n in range(3)]
        with serve(config, tmp_path) as served, ThreadPoolExecutor(3) as pool:
            with _client(served) as client:
                wait_ready(client, 10)
                for n in range(2):
                    done = client.post("/v1/chat/completions", json=chat_body(f"done {n}"))
                    assert done.status_code == 200
            ends = [pool.submit(_hang, served, rid) for rid in hanging]
            # Admitted and at the worker: their open lines reach the disk on their own.
            assert eventually(
                lambda: {o["request_id"] for o in read_open_lines(audit)} >= set(hanging), 10
            )
            served.signal(signal.SIGKILL)
            assert served.proc.wait(10) == -signal.SIGKILL
            assert all(end.result(30) != "ended" for end in ends)
    receipts = read_receipts(audit)
    assert len(receipts) == 2 and all(isinstance(r["open_seq"], int) for r in receipts)
    capsys.readouterr()
    assert main(["receipts", "verify", str(audit.parent)]) == 1
    out = capsys.readouterr().out.splitlines()
    unfinished = [line for line in out if line.startswith("unfinished: replica gw-k ")]
    assert len(unfinished) == 3 == len(out) - 1, out
    assert sorted(line.split(" request ")[1].split()[0] for line in unfinished) == hanging
    assert main(["receipts", "verify", "--allow-unfinished", str(audit.parent)]) == 0


def _anchors(config: Path) -> dict[str, Anchor]:
    async def read() -> dict[str, Anchor]:
        store = SqliteAnchorStore(load_config(config).staging.catalog)
        try:
            return await store.anchors()
        finally:
            await store.close()

    return asyncio.run(read())


def test_deleting_a_replicas_newest_receipts_is_found_against_its_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sim_running() as sim:
        config = _config(tmp_path, sim.port, "gw-t")
        audit = load_config(config).audit.path
        with serve(config, tmp_path) as served:
            with _client(served) as client:
                wait_ready(client, 10)
                for n in range(4):
                    answer = client.post("/v1/chat/completions", json=chat_body(f"anchored {n}"))
                    assert answer.status_code == 200
                # 4 open lines and 4 receipts: the head on disk is seq 8, anchored by itself.
                assert eventually(lambda: _seq(_anchors(config)) == 8, 10)
                assert metric(client, "gateway_receipts_chain_seq", replica="gw-t") == 8
            assert served.terminate() == 0
    argv: list[str] = ["receipts", "verify", "--anchors", "--config", str(config)]
    assert main([*argv, str(audit.parent)]) == 0
    lines = audit.read_bytes().splitlines(keepends=True)
    assert len(lines) == 8
    audit.write_bytes(b"".join(lines[:-2]))  # the newest request's open line and receipt
    capsys.readouterr()
    assert main(["receipts", "verify", str(audit.parent)]) == 0, "the links alone cannot see it"
    assert main([*argv, str(audit.parent)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith(
        "truncated: replica gw-t: the newest line here is seq 6, but the replica anchored seq 8"
    ), out


def _seq(anchors: dict[str, Any]) -> int | None:
    anchor = anchors.get("gw-t")
    return None if anchor is None else anchor.seq
