"""``mistralrs-gateway demo``: its report, its config, and the by-hand commands it prints.

Real processes: the demo itself, then the printed simulator, serve and token
commands, and the printed curl body sent to that gateway.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.process import REPO, serve, wait_ready
from tests.support.stack import sse_data

CLI = [sys.executable, "-m", "gateway.tools.cli"]


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("demo") / "run"
    result = _run(["demo", "--dir", str(directory)])
    assert result.returncode == 0, result.stderr[-2000:]
    report: dict[str, Any] = json.loads(result.stdout)
    report["_dir"] = str(directory)
    return report


def test_report_keeps_its_shape_and_names_its_config(demo: dict[str, Any]) -> None:
    for key in ("note", "launch", "evidence", "stream", "receipt", "config", "repeat"):
        assert key in demo, key
    assert "SIMULATOR" in demo["note"]
    assert demo["stream"]["done"] is True
    assert demo["receipt"]["outcome"] == "complete"
    assert len(demo["launch"]["serve_identity"]) == 64
    config = Path(demo["config"]["path"])
    assert config == Path(demo["_dir"]).resolve() / "gateway.yaml"
    assert config.is_file()
    assert [Path(p).name for p in demo["config"]["policies"]] == ["demo.yaml"]
    # The config it used passes check (with a secret of the operator's own).
    checked = _run(["check", "--config", str(config)], **{DEMO_SECRET_ENV: HS_SECRET})
    assert checked.returncode == 0, checked.stderr
    assert "tenant demo:" in checked.stdout


def test_no_secret_is_printed(demo: dict[str, Any]) -> None:
    text = json.dumps(demo)
    assert "eyJ" not in text  # no JWT
    export = demo["repeat"]["commands"][0]
    assert export.startswith(f'export {DEMO_SECRET_ENV}="$(python3 -c')


def _wait_line(path: Path, proc: subprocess.Popen[bytes], pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text())
        if found:
            return found
        assert proc.poll() is None, path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"no {pattern!r} in time")


def test_the_by_hand_commands_say_where_the_program_comes_from(demo: dict[str, Any]) -> None:
    # make demo installs into .venv and puts nothing on PATH: the commands name
    # mistralrs-gateway bare, so the note says how to get it there.
    note = demo["repeat"]["note"]
    assert "PATH" in note and ". .venv/bin/activate" in note


def test_the_by_hand_commands_repeat_the_run(demo: dict[str, Any], tmp_path: Path) -> None:
    commands = demo["repeat"]["commands"]
    simulator, served = shlex.split(commands[1]), shlex.split(commands[2])
    curl = shlex.split(commands[5])
    config = demo["config"]["path"]
    assert simulator[:2] == ["mistralrs-gateway", "simulator"] and simulator[-1] == "&"
    assert served == ["mistralrs-gateway", "serve", "--config", config, "--port", "8080", "&"]
    assert "/readyz" in commands[3]
    inner = re.fullmatch(r'TOKEN="\$\((.*)\)"', commands[4])
    assert inner is not None and inner.group(1).split()[:2] == ["mistralrs-gateway", "token"]
    assert curl[0] == "curl" and "http://127.0.0.1:8080/v1/chat/completions" in curl
    body = json.loads(curl[curl.index("-d") + 1])
    assert body == demo["request"]

    log = tmp_path / "simulator.out"
    with log.open("wb") as out:
        sim = subprocess.Popen([*CLI, *simulator[1:-1]], cwd=REPO, stdout=out)
    try:
        port = simulator[simulator.index("--port") + 1]
        _wait_line(log, sim, rf"simulator listening on http://127\.0\.0\.1:{port}")
        # serve exactly as printed, on a free port instead of 8080
        with serve(Path(config), tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)
            minted = _run(shlex.split(inner.group(1))[1:], **{DEMO_SECRET_ENV: HS_SECRET})
            assert minted.returncode == 0, minted.stderr
            headers = {"authorization": f"Bearer {minted.stdout.strip()}"}
            response = client.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200
            assert sse_data(response.text)[-1] == "[DONE]"
    finally:
        sim.kill()
        sim.wait(10)


def test_demo_refuses_a_directory_that_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = _run(["demo", "--dir", str(tmp_path)])
    assert result.returncode == 1
    assert "is not a demo directory" in result.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
