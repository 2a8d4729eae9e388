"""The worker's session ids (spec §22, §24) and the frames agent-event callers see."""

from __future__ import annotations

import hashlib
import hmac
import json
import re

from gateway.apis.agents import (
    approval_frame,
    file_frame,
    fresh_session_id,
    new_approval_id,
    new_file_id,
    tool_call_frame,
    worker_session_id,
)
from gateway.config.policy import TENANT_NAME

KEY = b"k" * 32


def test_the_worker_session_is_the_spec_hmac() -> None:
    expected = hmac.new(KEY, b"acme\nmy-session", hashlib.sha256).hexdigest()[:32]
    assert worker_session_id(KEY, "acme", "my-session") == "gs_" + expected


def test_sessions_are_per_tenant_and_per_key() -> None:
    one = worker_session_id(KEY, "acme", "s")
    assert one == worker_session_id(KEY, "acme", "s")
    assert one != worker_session_id(KEY, "globex", "s")
    assert one != worker_session_id(b"j" * 32, "acme", "s")
    # The pair is read one way only: a tenant name holds no newline.
    assert not re.fullmatch(TENANT_NAME, "a\nb") and not re.fullmatch(TENANT_NAME, "acme\n")


def test_fresh_sessions_have_the_same_shape_and_never_repeat() -> None:
    ids = {fresh_session_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"gs_[0-9a-f]{32}", i) for i in ids)
    assert re.fullmatch(r"gs_[0-9a-f]{32}", worker_session_id(KEY, "acme", "é🙂"))


def _parse(frame: bytes) -> tuple[str, object]:
    assert frame.endswith(b"\n\n") and frame.count(b"\n") == 3
    head, data = frame[:-2].split(b"\n")
    assert head.startswith(b"event: ") and data.startswith(b"data: ")
    return head[7:].decode(), json.loads(data[6:])


def test_tool_call_frames() -> None:
    assert _parse(tool_call_frame(0, "mistralrs_execute_python", "calling")) == (
        "agent.tool_call",
        {"round": 0, "tool": "mistralrs_execute_python", "phase": "calling"},
    )
    _, data = _parse(
        tool_call_frame(1, "mistralrs_search_the_web", "complete", "approve", ["docs.rs"])
    )
    assert data == {
        "round": 1,
        "tool": "mistralrs_search_the_web",
        "phase": "complete",
        "decision": "approve",
        "sources": ["docs.rs"],
    }


def test_file_and_approval_frames() -> None:
    digest = "0" * 64
    assert _parse(file_frame("file_x", "plot.png", 10, digest, "image/png")) == (
        "agent.file",
        {
            "id": "file_x",
            "name": "plot.png",
            "bytes": 10,
            "sha256": digest,
            "mime_type": "image/png",
        },
    )
    arguments = {"code": "print('a\\nb')\n", "n": 10**30, "s": "\u2028\ud800"}
    name, data = _parse(approval_frame("apr_1", 2, "python", "mistralrs_execute_python", arguments))
    assert name == "agent.approval_required"
    assert data == {
        "approval_id": "apr_1",
        "round": 2,
        "tool": {"kind": "python", "name": "mistralrs_execute_python"},
        "arguments": arguments,
    }


def test_ids_carry_128_random_bits() -> None:
    assert re.fullmatch(r"apr_[0-9a-f]{32}", new_approval_id())
    assert re.fullmatch(r"file_[0-9a-f]{32}", new_file_id())
    assert new_approval_id() != new_approval_id()
