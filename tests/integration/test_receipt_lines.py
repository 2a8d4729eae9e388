"""One receipt is one line for every reader, whatever the token's ``sub`` holds
(spec §21), through the real gateway: a signed JWT whose ``sub`` is about
12 KB (as long as the bearer bound, ``MAX_BEARER_CHARS``, lets a signed
token's ``sub`` be) with U+2028, U+2029, U+0085 (which ``str.splitlines()``
and JavaScript end a line at), a forged-looking JSON fragment and a lone
surrogate."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.auth.authenticator import MAX_BEARER_CHARS
from tests.support.stack import Stack, chat_body, running_stack, sse_data

_SEPARATORS = "\u2028\u2029\x85"
#: a line break, then something that would parse as a receipt of its own
_HEAD = (
    f"user-1{_SEPARATORS}"
    + '{"request_id": "forged", "tenant": "globex", "outcome": "complete"}'
    + "\u2028\ud800"
)


def _hostile_sub(stack: Stack) -> tuple[str, str]:
    """The longest such ``sub`` (in 100-character steps) whose token the gateway
    still reads, and that token."""
    best = None
    for padding in range(11_000, 12_500, 100):
        sub = _HEAD + "s" * padding + _SEPARATORS
        token = stack.rs256(sub=sub)
        if len(token) > MAX_BEARER_CHARS:
            break
        best = sub, token
    assert best is not None
    return best


def test_a_hostile_sub_lands_as_one_bounded_line_per_receipt(
    tmp_path: Path, _dev_secret: None
) -> None:
    with running_stack(tmp_path) as stack:
        hostile, token = _hostile_sub(stack)
        assert len(hostile.encode("utf-8", "surrogatepass")) > 11_500
        with stack.client(token, timeout=10) as client:
            plain = client.post(
                "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "sub-plain"}
            )
            assert plain.status_code == 200
            streamed = client.post(
                "/v1/chat/completions",
                json=chat_body(stream=True),
                headers={"x-request-id": "sub-stream"},
            )
            assert streamed.status_code == 200
            assert sse_data(streamed.text)[-1] == "[DONE]"
        with stack.client(timeout=10) as client:  # an ordinary caller after them
            ordinary = client.post(
                "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "sub-ordinary"}
            )
            assert ordinary.status_code == 200
        for request_id in ("sub-plain", "sub-stream", "sub-ordinary"):
            stack.receipt(request_id)
        data = stack.runtime.config.audit.path.read_bytes()

    text = data.decode("utf-8")
    lines = text.splitlines()  # every line break Python knows, U+2028 and U+0085 too
    # One line per receipt, and one per admission (the write-ahead open lines, spec §24).
    assert len(lines) == text.count("\n") == 6, "one line per receipt and open line"
    chain = [json.loads(line) for line in lines]
    receipts = [line for line in chain if line.get("kind") != "open"]
    assert [o["request_id"] for o in chain if o.get("kind") == "open"] == [
        "sub-plain",
        "sub-stream",
        "sub-ordinary",
    ]
    assert [r["request_id"] for r in receipts] == ["sub-plain", "sub-stream", "sub-ordinary"]
    assert "forged" not in {r["request_id"] for r in receipts}
    bounded = hostile[:256].replace("\ud800", "\ufffd")
    for receipt in receipts[:2]:
        assert receipt["outcome"] == "complete"
        assert len(receipt["subject"]) <= 256
        assert receipt["subject"] == bounded  # escaped, not lost: the same characters
    assert receipts[2]["subject"] == "user-1"
    for raw in (b"\xe2\x80\xa8", b"\xe2\x80\xa9", b"\xc2\x85"):
        assert raw not in data
