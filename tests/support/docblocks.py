"""Shell blocks of a Markdown page, run as a reader would run them.

A fenced block tagged ``sh`` is a command to run as written from the
repository root; anything else (``text``, ``yaml``, ``json``…) is an excerpt
or needs what a test machine lacks (a Docker daemon, a cluster, the
internet). :func:`run` gives a block what a reader's shell has after
``make setup``: the project's commands on ``PATH`` (this interpreter's
folder first), and nothing from the test session (no dev secret).

Each block runs under ``bash -euo pipefail`` in a session of its own, so a
block that starts servers and hangs is ended whole (its process group, by
the id of the session leader this helper started) when the time is up.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
HEADING = re.compile(r"^#{2,4} (.+)$", re.M)
#: variables of the test session that a reader's shell would not have
_SESSION_ONLY = ("MISTRALRS_GATEWAY_DEV_SECRET", "GATEWAY_URL", "GATEWAY_API_KEY")


@dataclass(frozen=True)
class Block:
    page: str
    lang: str
    code: str
    line: int
    section: str

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-")
        return f"{slug}-L{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    headings = [(m.start(), m.group(1).strip()) for m in HEADING.finditer(text)]
    found = []
    for match in FENCE.finditer(text):
        section = next((h for at, h in reversed(headings) if at < match.start()), "")
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page.name, match.group(1), match.group(2), line, section))
    return found


def shell_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang == "sh"]


def reader_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SESSION_ONLY}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run(block: Block, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    """Run one block from the repository root; its output, whatever the exit code."""
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=REPO,
        env=reader_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # The block's own children (servers it started) are in its session.
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout_s} s)"
        return subprocess.CompletedProcess(proc.args, -9, out, err)
    finally:
        # A block that exits early leaves nothing behind either.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
