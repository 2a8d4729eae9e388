"""docs/callers.md runs as written: every Python block (and every shell block, when
``curl`` is installed) against a real stack -- the gateway in front of the protocol
simulator, on loopback.

What the blocks get from here is only what a caller's environment gives them:
``GATEWAY_URL`` and ``GATEWAY_API_KEY`` (a static API key of tenant ``acme``),
and a working directory holding the media files they name. What the worker side
of an example needs (a tool call, a JSON answer for a schema) is the simulator's
business: :data:`KNOBS` sets it per section, outside the blocks, and every block
starts from a reset simulator.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.core import errors
from gateway.testing.harness import DEMO_SECRET_ENV, SIM_ROUTE
from gateway.testing.samples import build_mp4, build_png, build_wav
from tests.support.docblocks import HEADING, REPO, Block, blocks
from tests.support.jwt import HS_SECRET
from tests.support.stack import API_KEY, Stack, running_stack

DOC = REPO / "docs" / "callers.md"
ENDPOINTS = [
    "chat.completions",
    "completions",
    "responses",
    "embeddings",
    "messages",
    "images",
    "speech",
    "models",
    "evidence",
]
#: the Claude Code setup's output ceiling (fixtures/claude-code)
CLAUDE_CODE_OUTPUT = 32768
#: the image and speech models of the "Images and speech" examples (spec §23)
KINDS = {"/srv/models/flux-image": "image", "/srv/models/dia-speech": "speech"}
FILES = {"photo.png": build_png, "clip.wav": build_wav, "clip.mp4": build_mp4}
#: what the simulated worker answers in a section (its side of the example)
KNOBS: dict[str, dict[str, Any]] = {
    "Tool calls": {"tool_call": True},
    "Function tools": {"tool_call": True},
    "Structured output (JSON schema)": {"text": '{"city": "Paris", "country": "France"}'},
}


BLOCKS = blocks(DOC)
PYTHON = [b for b in BLOCKS if b.lang == "python"]
SHELL = [b for b in BLOCKS if b.lang == "sh"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    # Claude Code's 32000-token turns (its section) fit; the other examples name their bounds.
    limits = {
        "max_output_tokens": CLAUDE_CODE_OUTPUT,
        "requests_per_minute": 6000,
        "tokens_per_minute": 10**7,
    }

    models = {"gemma-4-mm": SIM_ROUTE, "flux-image": "/srv/models/flux-image"}
    models["dia-speech"] = "/srv/models/dia-speech"
    # the Claude Code section's alias (fixtures/claude-code/policies)
    models["claude-sonnet-4-5"] = SIM_ROUTE
    policy = {
        "endpoints": ENDPOINTS,
        "limits": limits,
        "evidence": {"max_bytes": 10_000_000, "max_records": 100},
        "models": models,
    }
    try:
        with running_stack(
            tmp_path_factory.mktemp("callers"),
            acme=policy,
            kinds=KINDS,
            limits={"max_output_tokens": CLAUDE_CODE_OUTPUT},
        ) as running:
            yield running
    finally:
        mp.undo()


@pytest.fixture
def caller(stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A caller's environment: the two variables and the media files in the cwd."""
    for name, build in FILES.items():
        (tmp_path / name).write_bytes(build())
    monkeypatch.setenv("GATEWAY_URL", stack.url)
    monkeypatch.setenv("GATEWAY_API_KEY", API_KEY)
    monkeypatch.chdir(tmp_path)
    stack.sim.reset()
    return tmp_path


@pytest.mark.parametrize("block", PYTHON, ids=[b.name for b in PYTHON])
def test_python_block_runs_as_written(
    block: Block, stack: Stack, caller: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.sim.set_knobs(**KNOBS.get(block.section, {}))
    try:
        code = compile(block.code, f"docs/callers.md:{block.line}", "exec")
        exec(code, {"__name__": "__main__"})  # noqa: S102 - the documented example itself
    finally:
        stack.sim.reset()
    assert capsys.readouterr().out.strip(), "every example shows its result"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("block", SHELL, ids=[b.name for b in SHELL])
def test_shell_block_runs_as_written(block: Block, caller: Path) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=caller,
        env=dict(os.environ),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    record = orjson.loads(done.stdout)
    assert record["object"] == "evidence" and record["id"].startswith("ev_")


def test_the_blocks_read_only_the_two_variables() -> None:
    """No address, key or test helper written into an example."""
    assert len(PYTHON) >= 15 and SHELL
    for block in BLOCKS:
        if block.lang not in ("python", "sh"):
            continue
        variables = set(re.findall(r"GATEWAY_[A-Z_]+", block.code))
        assert variables <= {"GATEWAY_URL", "GATEWAY_API_KEY"}, block.name
        assert "GATEWAY_URL" in variables, block.name
        for forbidden in ("127.0.0.1", "localhost", "sk-", "tests.", "gateway.testing", "[[sim"):
            assert forbidden not in block.code, (block.name, forbidden)
    assert set(KNOBS) <= {b.section for b in PYTHON}, "a knob names no section"


def test_every_endpoint_has_a_section_and_every_code_a_row() -> None:
    text = DOC.read_text()
    headings = {m.group(1).strip() for m in HEADING.finditer(text)}
    for needed in (
        "Chat completions",
        "Completions",
        "Responses",
        "Embeddings",
        "Images and speech",
        "Models",
        "Evidence (media)",
        "Errors",
        "Request ids and headers",
    ):
        assert needed in headings, needed
    rows = {
        code: int(status) for status, code in re.findall(r"^\| (\d{3}) \| `(\w+)` \|", text, re.M)
    }
    codes = {code: status for code, (status, _type) in errors._CODES.items()}
    assert rows == codes
    for header in (
        "x-request-id",
        "x-ratelimit-remaining-requests",
        "x-usage-source",
        "Retry-After",
    ):
        assert header in text, header


def test_the_readme_links_the_caller_guide() -> None:
    assert "docs/callers.md" in (REPO / "README.md").read_text()
