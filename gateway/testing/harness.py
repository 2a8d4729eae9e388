"""Run the gateway and the protocol simulator in-process on loopback.

Shared by ``mistralrs-gateway demo``, the benchmark and the integration
tests, so all three exercise the same real stack: a real uvicorn server on
127.0.0.1 in front of the simulator (test equipment, never a model).
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import uvicorn
import yaml

from gateway.config.loader import Loaded, load_all
from gateway.observe.tracing import Tracing
from gateway.testing.simulator.knobs import DEFAULT_MODEL_ID

SIM_ROUTE = DEFAULT_MODEL_ID
DEMO_SECRET_ENV = "MISTRALRS_GATEWAY_DEV_SECRET"  # noqa: S105 - a variable name


def new_dev_secret() -> str:
    return secrets.token_urlsafe(48)


def default_policy(tenant: str, **overrides: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "tenant": tenant,
        "models": {"gemma-4-mm": SIM_ROUTE},
        "endpoints": ["chat.completions", "completions", "models", "evidence"],
        "modalities": ["text", "image", "audio", "video"],
        "limits": {"max_output_tokens": 512, "requests_per_minute": 6000},
        "admission": {"share": 1, "max_permits": 8, "queue_timeout_s": 5},
        "media": {"caller_urls": "reject", "inline_data": "reject"},
    }
    policy.update(overrides)
    return policy


def write_config(
    directory: Path,
    *,
    upstream_port: int,
    policies: dict[str, dict[str, Any]],
    issuers: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> Path:
    """Write gateway.yaml and policies/<tenant>.yaml; return the config path."""
    (directory / "policies").mkdir(parents=True, exist_ok=True)
    for name, policy in policies.items():
        (directory / "policies" / f"{name}.yaml").write_text(yaml.safe_dump(policy))
    upstream: dict[str, Any] = {
        "base_url": f"http://127.0.0.1:{upstream_port}",
        "route": SIM_ROUTE,
        "readiness_poll_s": 0.2,
        "readiness_timeout_s": 1,
    }
    upstream.update(sections.pop("upstream", {}))
    workers: dict[str, Any] = {"upstream": upstream}
    if "upstreams" in sections:
        # Several workers (spec §16): each entry gets the fast readiness poll too.
        fast = {"readiness_poll_s": 0.2, "readiness_timeout_s": 1}
        workers = {"upstreams": [{**fast, **u} for u in sections.pop("upstreams")]}
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 5},
        **workers,
        "auth": {
            "issuers": issuers
            if issuers is not None
            else [
                {
                    "issuer": "https://dev.gateway.local",
                    "audience": "mistralrs-gateway",
                    "algorithms": ["HS256"],
                    "hs256_secret_env": DEMO_SECRET_ENV,
                }
            ]
        },
        "policies_dir": "policies",
        "staging": {"dir": "var/evidence", "catalog": "var/catalog.sqlite3"},
        "admission": {"capacity": 8, "max_queue": 64},
        "audit": {"path": "var/receipts.jsonl"},
    }
    config.update(sections)
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def read_receipts(path: Path) -> list[dict[str, Any]]:
    """The whole receipt lines written so far (a line being appended right now,
    not yet ended by its newline, is left for the next read); the write-ahead
    ``open`` lines of the chain (spec §24) are not receipts: :func:`read_open_lines`."""
    return [line for line in _audit_lines(path) if line.get("kind") != "open"]


def read_open_lines(path: Path) -> list[dict[str, Any]]:
    """The ``open`` lines written at admission (spec §24), in file order."""
    return [line for line in _audit_lines(path) if line.get("kind") == "open"]


def _audit_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    whole = path.read_bytes().split(b"\n")[:-1]
    return [orjson.loads(line) for line in whole if line.strip()]


def wait_receipt(path: Path, request_id: str, timeout_s: float = 5) -> dict[str, Any]:
    """Poll the audit file until the request's one receipt is there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [r for r in read_receipts(path) if r.get("request_id") == request_id]
        if len(found) > 1:
            raise AssertionError("more than one receipt for one request")
        if found:
            return found[0]
        time.sleep(0.01)
    raise TimeoutError("no receipt within the deadline")


class ThreadedServer:
    """uvicorn on its own thread and loop; ``start`` returns once it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)
        self.port = 0

    def start(self, timeout_s: float = 15) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.005)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self, timeout_s: float = 10) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


class Gateway:
    """A loaded config served by a ThreadedServer; ``runtime`` is the live Runtime."""

    def __init__(
        self, config_path: Path, *, tracing: Tracing | None = None, **server_options: Any
    ) -> None:
        from gateway.http.app import create_app
        from gateway.http.server import uvicorn_config

        self.loaded: Loaded = load_all(config_path)
        self.app = create_app(self.loaded, tracing)
        # The listener exactly as `serve` builds it, except: the stdlib event loop,
        # so that tracemalloc sees transport buffers in memory-bound tests, and a
        # short shutdown; tests may override single options.
        options: dict[str, Any] = {"loop": "asyncio", "timeout_graceful_shutdown": 2}
        options.update(server_options)
        config = uvicorn_config(self.loaded, self.app, "127.0.0.1", 0, **options)
        self.server = ThreadedServer(config)

    def __enter__(self) -> Gateway:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    @property
    def base_url(self) -> str:
        scheme = "https" if self.server.server.config.ssl else "http"
        return f"{scheme}://127.0.0.1:{self.server.port}"

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    def wait_ready(self, timeout_s: float = 10) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.runtime.accepting():
                return True
            time.sleep(0.01)
        return False
