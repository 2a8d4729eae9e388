"""The simulator's command line, alone and as ``mistralrs-gateway simulator``."""

from __future__ import annotations

import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.config.loader import load_config
from gateway.testing.simulator import DEFAULT_MODEL_ID, main
from gateway.tools import cli

_LISTENING = re.compile(r"simulator listening on (http://127\.0\.0\.1:(\d+))\n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def running(argv: list[str]) -> Iterator[tuple[str, int]]:
    """Start ``argv``; yield (base URL, port) once it printed its address; stop it by PID."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 10)
        assert ready, "no listening line within 10 s"
        line = process.stdout.readline()
        match = _LISTENING.fullmatch(line)
        assert match, line
        yield match.group(1), int(match.group(2))
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
        if process.stdout is not None:
            process.stdout.close()


def test_module_cli_serves_until_sigterm() -> None:
    argv = [sys.executable, "-m", "gateway.testing.simulator", "--port", "0", "--chunks", "2"]
    with running(argv) as (url, _):
        body = {
            "model": "default",
            "stream": False,
            "messages": [{"role": "user", "content": "hi"}],
        }
        response = httpx.post(url + "/v1/chat/completions", json=body, timeout=5)
        assert response.json()["usage"]["completion_tokens"] == 2


def test_module_cli_refuses_a_non_loopback_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", "0.0.0.0"]) == 2
    assert "loopback" in capsys.readouterr().err


def test_the_default_route_is_the_example_configs() -> None:
    """A newcomer's gateway on fixtures/config/gateway.yaml in front of a bare
    `mistralrs-gateway simulator` is ready: both name the same route."""
    example = Path(__file__).resolve().parents[3] / "fixtures" / "config" / "gateway.yaml"
    assert load_config(example).workers[0].served_routes == [DEFAULT_MODEL_ID]


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for line in [
        "--host HOST loopback address to bind (default: 127.0.0.1)",
        "--port PORT port to listen on (0: any free port) (default: 0)",
        "--chunks CHUNKS text chunks per answer (default: 8)",
        "--keepalive-ms KEEPALIVE_MS idle time before a keep-alive (default: 10000.0)",
        "--dims DIMS embedding dimensions (default: 8)",
        "--id-seed ID_SEED seed of the Responses ids (default: random)",
    ]:
        assert line in text
    assert DEFAULT_MODEL_ID[:20] in text and "repeat for several" in text


def test_gateway_verb_passes_every_flag_through(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["simulator", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mistralrs-gateway simulator [-h] [--host HOST] [--port PORT]")
    assert cli.main(["simulator", "--host", "0.0.0.0"]) == 2
    assert "loopback" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["simulator", "--port", "many"])
    assert "invalid int value" in capsys.readouterr().err


def test_gateway_verb_serves_on_the_given_port_with_two_routes() -> None:
    port = _free_port()
    argv = [sys.executable, "-m", "gateway.tools.cli", "simulator", "--port", str(port)]
    argv += ["--model-id", "/m/a", "--model-id", "/m/b", "--chunks", "2"]
    with running(argv) as (url, bound):
        assert bound == port
        models = httpx.get(url + "/v1/models", timeout=5).json()["data"]
        assert [m["id"] for m in models] == ["default", "/m/a", "/m/b"]
        body = {"model": "/m/b", "messages": "hi"}
        answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=5).json()
        assert answer["model"] == "/m/b" and answer["usage"]["completion_tokens"] == 2


def test_module_cli_refuses_duplicate_routes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model-id", "/m/a", "--model-id", "/m/a"]) == 2
    assert "Model ID conflict" in capsys.readouterr().err


def test_cli_text_and_tool_call_flags() -> None:
    """Structured output and tools from the command line: a fixed answer text and a
    fixed tool call, on chat, Responses and Messages alike; routes of each kind; an
    agentic plan."""
    answer = '{"city": "Paris"}'
    argv = [sys.executable, "-m", "gateway.testing.simulator", "--chunks", "3"]
    argv += ["--text", answer, "--tool-name", "get_weather"]
    argv += ["--tool-arguments", '{"city": "Paris", "unit": "C"}']
    argv += ["--model-id", "/m/chat", "--image-model", "/m/img", "--speech-model", "/m/tts"]
    argv += ["--agent", "mcp:docs_lookup,python", "--agent-permission", "deny"]
    with running(argv) as (url, _), httpx.Client(base_url=url, timeout=5) as c:
        chat = c.post("/v1/chat/completions", json={"messages": "hi"}).json()
        responses = c.post("/v1/responses", json={"input": "hi"}).json()
        body = {
            "model": "default",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}],
        }
        messages = c.post("/v1/messages", json=body).json()
        listed = [m["id"] for m in c.get("/v1/models").json()["data"]]
        image = {"model": "/m/img", "prompt": "x", "response_format": "B64Json"}
        png = c.post("/v1/images/generations", json=image).json()["data"][0]["b64_json"]
        speech = {"model": "/m/tts", "input": "x", "response_format": "wav"}
        wav = c.post("/v1/audio/speech", json=speech)
        refused = c.post("/v1/audio/speech", json={**speech, "model": "/m/chat"})
        tools = [{"type": "code_interpreter", "container": {"type": "auto"}}]
        agentic = c.post("/v1/chat/completions", json={"messages": "hi", "tools": tools}).json()
    assert listed == ["default", "/m/chat", "/m/img", "/m/tts"]
    assert png.startswith("data:image/png;base64,iVBORw0KGgo")
    assert wav.content.startswith(b"RIFF") and refused.status_code == 422
    calls = agentic["agentic_tool_calls"]
    assert [c["name"] for c in calls] == ["docs_lookup", "mistralrs_execute_python"]
    assert calls[1]["result_content"] == "exception: Python code was denied by policy."
    assert "agentic_tool_calls" not in chat  # a plain request is not agentic
    message = chat["choices"][0]["message"]
    assert message["content"] == answer and chat["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = message["tool_calls"]
    assert call["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris", "unit": "C"}',
    }
    function_call = responses["output"][0]
    assert function_call["name"] == "get_weather"
    assert function_call["arguments"] == '{"city": "Paris", "unit": "C"}'
    assert responses["output_text"] == answer
    text, tool_use = messages["content"]
    assert text == {"type": "text", "text": answer}
    assert tool_use["name"] == "get_weather" and tool_use["input"] == {"city": "Paris", "unit": "C"}
    assert messages["stop_reason"] == "tool_use"


def test_cli_refuses_bad_knob_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tool-arguments", "{not json"]) == 2
    assert "tool_arguments must be a JSON text" in capsys.readouterr().err
    assert main(["--agent", "teleport:x"]) == 2
    assert "unknown tool kind" in capsys.readouterr().err
