"""``mistralrs-gateway demo``: the main job on an embedded default.

Starts the mistral.rs protocol SIMULATOR (test equipment: its text is
generated filler, never model output) and the gateway on loopback with a
generated config, stages the sample image/audio/video as evidence, sends one
authenticated multimodal streaming request (image → audio → video → text)
through the gateway, and prints one JSON report: launch identity, the
request as forwarded, the streamed result and the receipt, then which config
it used and the commands that repeat the run by hand.

The config, policies, staged evidence and receipts stay in the demo
directory (default ``var/demo``; a marker file makes it the demo's own, so
a rerun starts it afresh and a directory of anything else is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.auth.authenticator import mint_dev_token
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    SIM_ROUTE,
    Gateway,
    default_policy,
    new_dev_secret,
    wait_receipt,
    write_config,
)
from gateway.testing.samples import SAMPLES
from gateway.testing.simulator import Simulator

_UPLOADS = (("tiny.png", "image/png"), ("tiny.wav", "audio/wav"), ("tiny.mp4", "video/mp4"))
DEFAULT_DIR = Path("var/demo")
_MARKER = ".mistralrs-gateway-demo"
#: the gateway's port in the by-hand commands (the demo itself uses any free one)
HAND_PORT = 8080
_SIM_CHUNKS, _SIM_DELAY_MS = 12, 5
#: the by-hand commands let the operator's shell make a dev secret (never printed here)
_SHELL_NEW_KEY = "$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')"


def _launch_block(port: int) -> dict[str, Any]:
    # A pinned worker as an operator would describe it; the simulator stands in for it.
    bundle = SIM_ROUTE.rsplit("/", 1)[1]
    return {
        "version": "0.9.2",
        "binary_sha256": hashlib.sha256(b"demo: mistralrs binary digest").hexdigest(),
        "model_public_id": "demo/simulated-multimodal",
        "model_revision": "0" * 40,
        "model_bundle_sha256": bundle,
        "model_dir": SIM_ROUTE,
        "port": port,
        "device": "cpu",
    }


@dataclass
class StreamRead:
    """One streamed chat request as the caller saw it (both demos report from it)."""

    status: int
    request_id: str | None
    chunks: list[Any]
    keepalives: int
    done: bool
    sent: float
    #: when the first chunk with content arrived (None: none did)
    first_content: float | None
    ended: float

    @property
    def text(self) -> str:
        return "".join(
            ((c.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
            for c in self.chunks
            if isinstance(c, dict)
        )


def read_stream(client: httpx.Client, body: dict[str, Any]) -> StreamRead:
    chunks: list[Any] = []
    keepalives = 0
    done = False
    first_content: float | None = None
    sent = time.monotonic()
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        request_id = response.headers.get("x-request-id")
        status = response.status_code
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                chunks.append(chunk)
                if first_content is None and isinstance(chunk, dict):
                    choices = chunk.get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        first_content = time.monotonic()
            elif line.startswith(":"):
                keepalives += 1
    ended = time.monotonic()
    return StreamRead(status, request_id, chunks, keepalives, done, sent, first_content, ended)


def _stream(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    read = read_stream(client, body)
    return {
        "status": read.status,
        "request_id": read.request_id,
        "chunks": len(read.chunks),
        "keepalives": read.keepalives,
        "done": read.done,
        "final_usage": read.chunks[-1].get("usage") if read.chunks else None,
        "simulator_text_sample": read.text[:60],
    }


def prepare_dir(directory: Path) -> Path:
    """The demo directory, emptied if it is the demo's own; ValueError for any other."""
    if directory.exists() and any(directory.iterdir()):
        if not (directory / _MARKER).is_file():
            raise ValueError(f"{directory} exists and is not a demo directory")
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / _MARKER).write_text("written by `mistralrs-gateway demo`; rerun replaces it\n")
    return directory.resolve()


def run_demo(directory: Path = DEFAULT_DIR) -> int:
    try:
        directory = prepare_dir(directory)
    except (ValueError, OSError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    secret = new_dev_secret()
    os.environ[DEMO_SECRET_ENV] = secret
    sim = Simulator(model_id=SIM_ROUTE, chunks=_SIM_CHUNKS, delay_ms=_SIM_DELAY_MS)
    sim.start()
    try:
        config = write_config(
            directory,
            upstream_port=sim.port,
            policies={"demo": default_policy("demo")},
            upstream={"launch": _launch_block(sim.port)},
        )
        with Gateway(config) as gateway:
            if not gateway.wait_ready():
                print("demo: the gateway never saw the simulator ready", file=sys.stderr)
                return 1
            report = _exchange(gateway, secret)
    finally:
        sim.stop()
    report["config"] = {
        "path": str(config),
        "policies": [str(p) for p in sorted((directory / "policies").glob("*.yaml"))],
        "upstream": f"http://127.0.0.1:{sim.port} (the simulator)",
    }
    report["repeat"] = _by_hand(config, sim.port, report)
    print(json.dumps(report, indent=2))
    ok = report["stream"]["done"] and report["receipt"]["outcome"] == "complete"
    return 0 if ok else 1


def _by_hand(config: Path, sim_port: int, report: dict[str, Any]) -> dict[str, Any]:
    """The same run by hand: one shell command per step, in order."""
    quoted = shlex.quote(str(config))
    body = json.dumps(report["request"], separators=(",", ":"))
    simulator = (
        f"mistralrs-gateway simulator --port {sim_port} --model-id {SIM_ROUTE} "
        f"--chunks {_SIM_CHUNKS} --delay-ms {_SIM_DELAY_MS} &"
    )
    return {
        "note": (
            "run from one shell with mistralrs-gateway on PATH (after make demo:"
            " . .venv/bin/activate); the evidence ids above stay valid (same staging dir)"
        ),
        "commands": [
            f'export {DEMO_SECRET_ENV}="{_SHELL_NEW_KEY}"',
            simulator,
            f"mistralrs-gateway serve --config {quoted} --port {HAND_PORT} &",
            f"for _ in $(seq 50); do curl -sf http://127.0.0.1:{HAND_PORT}/readyz >/dev/null "
            "&& break; sleep 0.2; done",
            f'TOKEN="$(mistralrs-gateway token --config {quoted} --tenant demo)"',
            f"curl -sN http://127.0.0.1:{HAND_PORT}/v1/chat/completions "
            '-H "authorization: Bearer $TOKEN" -H "content-type: application/json" '
            f"-d {shlex.quote(body)}",
        ],
    }


def _exchange(gateway: Gateway, secret: str) -> dict[str, Any]:
    runtime = gateway.runtime
    token = mint_dev_token(
        runtime.config.auth,
        "demo",
        scopes=["inference", "evidence"],
        ttl_s=300,
        env={DEMO_SECRET_ENV: secret},
    )
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as client:
        evidence = []
        for name, mime in _UPLOADS:
            response = client.post(
                "/v1/evidence",
                content=SAMPLES[name](),
                headers={"content-type": mime, "x-evidence-locator": f"demo://{name}"},
            )
            response.raise_for_status()
            evidence.append(response.json())
        kinds = ("image_url", "audio_url", "video_url")
        content: list[dict[str, Any]] = [
            {"type": kind, kind: {"url": f"evidence:{record['id']}"}}
            for kind, record in zip(kinds, evidence, strict=True)
        ]
        content.append({"type": "text", "text": "Describe the evidence. [[sim chunks=12]]"})
        body = {
            "model": "gemma-4-mm",
            "messages": [{"role": "user", "content": content}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 64,
        }
        stream = _stream(client, body)
    receipt = wait_receipt(runtime.config.audit.path, stream["request_id"] or "", 10)
    return {
        "note": "upstream is the mistral.rs protocol SIMULATOR; its text is filler, not inference",
        "launch": {"serve_identity": runtime.table.worker_for(SIM_ROUTE).serve_identity},
        "evidence": evidence,
        "request": body,
        "stream": stream,
        "receipt": receipt,
    }
