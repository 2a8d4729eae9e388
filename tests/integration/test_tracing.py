"""Tracing configured the way an operator does it: ``mistralrs-gateway serve``
with the standard ``OTEL_*`` variables, exporting OTLP/HTTP to a loopback
receiver (a small protobuf endpoint in the test thread)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from gateway.observe.tracing import NS
from gateway.testing.harness import write_config
from tests.support.process import Served, serve, sim_running, wait_ready, wait_until
from tests.support.stack import chat_body, issuers, policies, worker_posts

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


@dataclass
class Received:
    """What the receiver was sent: (resource attributes, span) per span."""

    spans: list[tuple[dict[str, Any], Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[Any]:
        with self.lock:
            return [span for _, span in self.spans if span.name == name]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def attributes(span_or_resource: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in span_or_resource.attributes}


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            request = ExportTraceServiceRequest.FromString(body)
            with received.lock:
                for resource_spans in request.resource_spans:
                    resource = attributes(resource_spans.resource)
                    for scope_spans in resource_spans.scope_spans:
                        received.spans += [(resource, s) for s in scope_spans.spans]
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _env(endpoint: str, **extra: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        **extra,
    }


def _config(tmp: Path, port: int) -> Path:
    return write_config(
        tmp,
        upstream_port=port,
        policies=policies(),
        issuers=issuers(),
        listen={"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 5},
    )


def _chat(served: Served, count: int = 1, **extra: Any) -> list[httpx.Response]:
    """Once the replica is ready, ``count`` chat requests of ``extra`` (body
    fields, and ``headers``), each answered 200."""
    headers = {"authorization": f"Bearer {served.dev_token()}", **extra.pop("headers", {})}
    with httpx.Client(base_url=served.url, timeout=10) as client:
        wait_ready(client)
        responses = [
            client.post("/v1/chat/completions", json=chat_body(**extra), headers=headers)
            for _ in range(count)
        ]
    assert [r.status_code for r in responses] == [200] * count
    return responses


def test_serve_exports_the_callers_trace_over_otlp(tmp_path: Path) -> None:
    with otlp_receiver() as (endpoint, received), sim_running() as sim:
        env = _env(endpoint, OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=test")
        env.pop("OTEL_SERVICE_NAME", None)
        with serve(_config(tmp_path, sim.port), tmp_path, env) as served:
            [response] = _chat(
                served,
                text="hi [[sim chunks=4]]",
                stream=True,
                headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
            )
            request_id = response.headers["x-request-id"]
            wait_until(
                lambda: any(
                    attributes(s).get(NS + "request_id") == request_id
                    for s in received.named("chat gemma-4-mm")
                ),
                10,
                "the request's server span at the receiver",
            )
        assert "tracing: on, exporters otlp" in served.stderr_text()

    with received.lock:
        ours = [(r, s) for r, s in received.spans if s.trace_id.hex() == TRACE_ID]
    resource, server = next((r, s) for r, s in ours if s.name == "chat gemma-4-mm")
    assert resource["service.name"] == "mistralrs-gateway"
    assert resource["deployment.environment.name"] == "test"
    assert server.parent_span_id.hex() == PARENT_ID
    attrs = attributes(server)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "gemma-4-mm"
    assert attrs["gen_ai.usage.output_tokens"] > 0
    assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
    children = {s.name: s for _, s in ours if s.parent_span_id == server.span_id}
    assert set(children) == {"gateway.limits", "gateway.admission", "POST /v1/chat/completions"}
    worker_span = children["POST /v1/chat/completions"]
    [post] = [r for r in worker_posts(sim) if r.headers["x-request-id"] == request_id]
    assert post.headers["traceparent"] == f"00-{TRACE_ID}-{worker_span.span_id.hex()}-01"


def test_sigterm_exports_the_spans_still_batched(tmp_path: Path) -> None:
    # A batch delay far past the test: only the shutdown's flush can deliver them.
    with otlp_receiver() as (endpoint, received), sim_running() as sim:
        env = _env(endpoint, OTEL_BSP_SCHEDULE_DELAY="600000", OTEL_SERVICE_NAME="gw-test")
        with serve(_config(tmp_path, sim.port), tmp_path, env) as served:
            [response] = _chat(served)
            assert not received.named("chat gemma-4-mm")
            served.signal(signal.SIGTERM)
            assert served.proc.wait(15) == 0
        [server] = received.named("chat gemma-4-mm")
        with received.lock:
            [resource] = {tuple(sorted(r.items())) for r, _ in received.spans}
        assert dict(resource)["service.name"] == "gw-test"
        assert attributes(server)[NS + "request_id"] == response.headers["x-request-id"]


def test_an_unsupported_exporter_is_named_and_serving_goes_on(tmp_path: Path) -> None:
    with sim_running() as sim:
        env = {"OTEL_TRACES_EXPORTER": "zipkin"}
        with serve(_config(tmp_path, sim.port), tmp_path, env) as served:
            with httpx.Client(base_url=served.url, timeout=10) as client:
                wait_ready(client)
            served.signal(signal.SIGTERM)
            served.proc.wait(15)
        stderr = served.stderr_text()
        assert "tracing: OTEL_TRACES_EXPORTER: 'zipkin' is not supported" in stderr
        assert "tracing: on" not in stderr
        assert "Traceback" not in stderr


def test_the_collector_being_down_costs_no_request(tmp_path: Path) -> None:
    # Nothing listens on the endpoint: spans are dropped by the exporter's
    # thread, requests are served, the shutdown stays bounded.
    with otlp_receiver() as (endpoint, _):
        pass  # a port that was just ours and is closed now
    with sim_running() as sim:
        env = _env(endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="1")
        with serve(_config(tmp_path, sim.port), tmp_path, env) as served:
            _chat(served, 5)
            served.signal(signal.SIGTERM)
            assert served.proc.wait(15) == 0
        assert "Traceback" not in served.stderr_text()


def test_a_collector_that_never_answers_does_not_hold_the_shutdown(tmp_path: Path) -> None:
    """It accepts connections and reads, never replies; the exporter's own
    timeout (10 s by default) is left as it is. The drain and the bounded
    tracing close end the process well inside a termination grace."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)  # never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/traces"
    try:
        with sim_running() as sim:
            env = _env(endpoint)
            with serve(_config(tmp_path, sim.port), tmp_path, env) as served:
                _chat(served, 20)
                wait_until(lambda: bool(held), 5, "the exporter connected to the collector")
                served.signal(signal.SIGTERM)
                # The bound, not a timing figure: drain (nothing in flight) plus
                # tracing close (2 s) plus the rest of the shutdown.
                assert served.proc.wait(8) == 0
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()
