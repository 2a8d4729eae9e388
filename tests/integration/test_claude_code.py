"""Claude Code works from the docs alone (spec §24, issue 36).

- docs/callers.md "Claude Code": its worked example runs whole, as written
  (the ready files copied, a key, the simulator standing in for the worker,
  a Claude-Code-sized turn and a count over curl);
- the ready files (``fixtures/claude-code``) with only the worker's address,
  the ports and the key changed, in front of the simulator: a recorded
  Claude-Code-shaped session (``fixtures/claude-code/session.json``, written
  by its ``make_session.py``) replayed request by request with the official
  ``anthropic`` SDK as Claude Code calls it (``beta`` resource: ``?beta=true``
  and ``anthropic-beta``; ``Authorization: Bearer``; its headers): a 150 KiB
  system prompt and tools with ``cache_control``, ``max_tokens`` 32000 with a
  thinking budget, quota and topic calls to the small model, turns with
  ``thinking``, ``tool_use`` and ``tool_result`` blocks, ``count_tokens``; then
  one turn more built from the gateway's own answer, as Claude Code builds it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import shutil
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
import yaml

from gateway.testing.harness import Gateway, read_receipts
from gateway.testing.simulator import Simulator
from tests.support.docblocks import REPO, blocks, run
from tests.support.poll import eventually
from tests.support.stack import worker_posts

READY = REPO / "fixtures" / "claude-code"
SESSION: dict[str, Any] = json.loads((READY / "session.json").read_text())
KEY = "sk-test-claude-code-" + "5" * 40
BETAS = SESSION["headers"]["anthropic-beta"].split(",")
#: what the SDK does not send by itself: Claude Code's own headers
HEADERS = {
    k: v for k, v in SESSION["headers"].items() if k not in ("anthropic-version", "anthropic-beta")
}
TOOLU = re.compile(r"toolu_[0-9a-f]{24}")


def test_the_docs_worked_example_runs_as_written() -> None:
    """docs/callers.md, section "Claude Code": its ``bash`` block, whole."""
    [block] = [
        b
        for b in blocks(REPO / "docs" / "callers.md")
        if b.section == "Claude Code" and b.lang == "bash"
    ]
    done = run(block, timeout_s=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tenant claude-code: models [claude-haiku-4-5, claude-opus-4-1")
    assert "max_output_tokens=32768" in lines[0] and "max_prompt_bytes=4194304" in lines[0]
    assert lines[1] == "claude-sonnet-4-5 end_turn"
    assert json.loads(lines[2])["input_tokens"] > 0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Simulator]]:
    """The ready files in a folder of their own, as the docs say to use them."""
    directory = tmp_path_factory.mktemp("claude-code")
    shutil.copytree(READY, directory, dirs_exist_ok=True)
    sim = Simulator()
    sim.start()
    sim.set_knobs(reasoning=2)  # thinking in every answer
    try:
        config_path = directory / "gateway.yaml"
        config = yaml.safe_load(config_path.read_text())
        config["upstream"]["base_url"] = sim.base_url
        config["listen"]["port"] = 0
        config["metrics"]["listen"]["port"] = 0
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        policy_path = directory / "policies" / "claude-code.yaml"
        policy = yaml.safe_load(policy_path.read_text())
        policy["api_keys"][0]["sha256"] = hashlib.sha256(KEY.encode()).hexdigest()
        policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))
        with Gateway(config_path) as served:
            assert served.wait_ready(), "the gateway never saw the simulator ready"
            yield served, sim
    finally:
        sim.stop()


def _client(gateway: Gateway) -> anthropic.Anthropic:
    # ANTHROPIC_BASE_URL and ANTHROPIC_AUTH_TOKEN, as Claude Code reads them
    return anthropic.Anthropic(
        base_url=gateway.base_url,
        auth_token=KEY,
        max_retries=0,
        timeout=30,
        default_headers=HEADERS,
    )


def _keys(value: Any) -> set[str]:
    """Every object key in a JSON value, at any depth."""
    found: set[str] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            found.update(current)
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return found


def _body(request: dict[str, Any]) -> dict[str, Any]:
    body = dict(request["body"])
    for part in request["with"]:
        body[part] = SESSION[part]
    return body


def _call(method: Any, body: dict[str, Any]) -> Any:
    """``method(**body)``, what the Python SDK has no parameter for (``temperature``,
    which Claude Code's TypeScript SDK sends) in ``extra_body``: the same JSON."""
    known = inspect.signature(method).parameters
    extra = {k: body.pop(k) for k in list(body) if k not in known}
    return method(**body, betas=BETAS, extra_body=extra or None)


def _send(client: anthropic.Anthropic, sim: Simulator, request: dict[str, Any]) -> Any:
    """One recorded request as Claude Code makes it; the worker's side of it set."""
    body = _body(request)
    if request["path"].startswith("/v1/messages/count_tokens"):
        return _call(client.beta.messages.count_tokens, body)
    sim.set_knobs(tool_call=request["answer"] == "tool_use")
    try:
        if body.pop("stream", False):
            with _call(client.beta.messages.stream, body) as stream:
                return stream.get_final_message()
        return _call(client.beta.messages.create, body)
    finally:
        sim.set_knobs(tool_call=False)


def test_a_recorded_session_replays_through_the_ready_files(
    gateway: tuple[Gateway, Simulator],
) -> None:
    served, sim = gateway
    sim.reset()  # what reached the worker: this session's requests only
    sim.set_knobs(reasoning=2)
    system_bytes = len(SESSION["system"][1]["text"].encode())
    assert system_bytes >= 150 * 1024
    answers = []
    with _client(served) as client:
        for request in SESSION["requests"]:
            answers.append(_send(client, sim, request))
    for request, answer in zip(SESSION["requests"], answers, strict=True):
        if request["path"].startswith("/v1/messages/count_tokens"):
            assert answer.input_tokens > 0
            continue
        assert answer.model == request["body"]["model"]
        if not request["body"].get("stream"):
            assert answer._request_id  # the request-id header (a stream's final has none)
        kinds = [block.type for block in answer.content]
        if request["answer"] == "tool_use":
            assert answer.stop_reason == "tool_use" and kinds[-1] == "tool_use"
            assert TOOLU.fullmatch(answer.content[-1].id)
        else:
            assert answer.stop_reason in ("end_turn", "max_tokens") and "tool_use" not in kinds
        if request["body"].get("thinking"):
            assert kinds[0] == "thinking"
    # What reached the worker: the whole system prompt, the tool results, no Anthropic header.
    turns = [p for p in worker_posts(sim) if p.path == "/v1/chat/completions"]
    big = [t for t in turns if t.json and t.json["max_tokens"] == 32000]
    assert len(big) == 3
    for turn in big:
        assert turn.json is not None and turn.json["enable_thinking"] is True
        system = turn.json["messages"][0]
        assert system["role"] == "system" and len(json.dumps(system)) >= system_bytes
        assert len(turn.json["tools"]) == len(SESSION["tools"])
        assert not any(k.startswith("anthropic") or k == "x-app" for k in turn.headers)
    last = big[-1].json
    assert last is not None
    results = [m for m in last["messages"] if m["role"] == "tool"]
    assert [r["tool_call_id"] for r in results] == [
        "toolu_01A9fQe3kXb8Zp2cLmN4vR7s",
        "toolu_01Bx7Hw2TqL5nCj8Ud3Ke6Yp",
    ]
    counts = [p for p in worker_posts(sim) if p.path == "/v1/messages/count_tokens"]
    assert len(counts) == 2
    for forwarded in (*counts, *big):  # dropped at every level (the text may name it)
        assert "cache_control" not in _keys(forwarded.json)
    path = served.runtime.config.audit.path
    # The receipt writer batches: every request's receipt, once written.
    assert eventually(lambda: len(read_receipts(path)) >= len(SESSION["requests"]), 10)
    receipts = read_receipts(path)
    # every one served; the one-token quota probe ends at its max_tokens
    assert {r["outcome"] for r in receipts} == {"complete", "length"}
    assert {r["endpoint"] for r in receipts} == {"messages", "messages.count_tokens"}


def test_the_next_turn_returns_the_gateways_tool_use_id(
    gateway: tuple[Gateway, Simulator],
) -> None:
    """Claude Code builds its next turn from the answer: the assistant's blocks as
    they came, and a tool_result naming the gateway's tool_use id."""
    served, sim = gateway
    first = next(r for r in SESSION["requests"] if r.get("answer") == "tool_use")
    with _client(served) as client:
        answer = _send(client, sim, first)
        use = answer.content[-1]
        assert use.type == "tool_use" and TOOLU.fullmatch(use.id)
        follow = {**first, "answer": "text"}
        follow["body"] = {
            **first["body"],
            "messages": [
                *first["body"]["messages"],
                {"role": "assistant", "content": [b.model_dump() for b in answer.content]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use.id,
                            "content": "ok",
                            "cache_control": {"type": "ephemeral"},
                        }
                    ],
                },
            ],
        }
        again = _send(client, sim, follow)
    assert again.stop_reason == "end_turn"
    [*_, sent] = [p for p in worker_posts(sim) if p.path == "/v1/chat/completions"]
    assert sent.json is not None
    assistant, result = sent.json["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == result["tool_call_id"] == use.id


def test_what_claude_code_sends_too_large_is_named(gateway: tuple[Gateway, Simulator]) -> None:
    """Past the ready policy's bounds: the refusals say what to shorten."""
    served, _ = gateway
    turn = next(r for r in SESSION["requests"] if r.get("answer") == "tool_use")
    body = _body(turn)
    body["system"] = [{"type": "text", "text": "x" * (4 * 1024 * 1024 + 1)}]
    body.pop("stream")
    with _client(served) as client:
        with pytest.raises(anthropic.BadRequestError) as info:
            _call(client.beta.messages.create, body)
        assert info.value.body["error"]["param"] == "system"  # type: ignore[index]
        more = {**_body(turn), "max_tokens": 40_000}
        more.pop("stream")
        with pytest.raises(anthropic.BadRequestError) as over:
            _call(client.beta.messages.create, more)
        assert over.value.body["error"]["code"] == "output_tokens_exceeded"  # type: ignore[index]
