"""What callers that sent ``x-agent-events: 1`` see of a run (spec §22). Pure.

Three named SSE events, each one frame (``event: …`` and one ``data:`` line
of compact ASCII JSON), written from typed values -- the worker's bytes are
never passed through:

* ``agent.tool_call`` ``{"round", "tool", "phase", "decision"?, "sources"?}``:
  a round's call (``phase`` ``calling``) and its end (``complete``, with
  the gateway's ``decision`` once it made one); no tool output, except the
  result domains of a web search (``sources``);
* ``agent.file`` ``{"id", "name", "bytes", "sha256", "mime_type"}``: a kept
  file, under the gateway's id, with the type sniffed from its bytes;
* ``agent.approval_required`` ``{"approval_id", "round", "tool": {"kind",
  "name"}, "arguments"}``: the caller decides (``approval: caller``), by the
  gateway's id, never the worker's.

Ids are ``apr_`` / ``file_`` and 128 random bits (spec: ≥ 96).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any, Literal

__all__ = [
    "approval_frame",
    "file_frame",
    "new_approval_id",
    "new_file_id",
    "tool_call_frame",
]


def _frame(name: str, payload: dict[str, Any]) -> bytes:
    # ASCII JSON: one line whatever the strings hold (a lone surrogate from the
    # worker's escapes included), and any integer the worker's JSON had.
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=True)
    return b"event: " + name.encode() + b"\ndata: " + data.encode("ascii") + b"\n\n"


def new_approval_id() -> str:
    return "apr_" + secrets.token_hex(16)


def new_file_id() -> str:
    return "file_" + secrets.token_hex(16)


def tool_call_frame(
    round: int,
    tool: str,
    phase: Literal["calling", "complete"],
    decision: Literal["approve", "deny"] | None = None,
    sources: Sequence[str] | None = None,
) -> bytes:
    """``event: agent.tool_call``; ``sources`` only for a web search's complete."""
    payload: dict[str, Any] = {"round": round, "tool": tool, "phase": phase}
    if decision is not None:
        payload["decision"] = decision
    if sources is not None:
        payload["sources"] = list(sources)
    return _frame("agent.tool_call", payload)


def file_frame(file_id: str, name: str, size: int, sha256: str, mime_type: str) -> bytes:
    """``event: agent.file`` for a kept file (``mime_type`` sniffed by the gateway)."""
    payload = {"id": file_id, "name": name, "bytes": size, "sha256": sha256, "mime_type": mime_type}
    return _frame("agent.file", payload)


def approval_frame(approval_id: str, round: int, kind: str, name: str, arguments: Any) -> bytes:
    """``event: agent.approval_required``: ``kind`` is the policy's word
    (``web_search``, ``python``, ``mcp``), ``name`` the worker's tool name."""
    payload = {
        "approval_id": approval_id,
        "round": round,
        "tool": {"kind": kind, "name": name},
        "arguments": arguments,
    }
    return _frame("agent.approval_required", payload)
