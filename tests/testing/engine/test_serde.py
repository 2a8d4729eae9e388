"""The SDK's response objects, written as serde_json writes the same Rust structs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import mistralrs
import pytest

from gateway.testing.engine import modelgen, serde

# Reference §3.2 / §4 key orders, and where 0.9.5's extra fields sit among them.
CHUNK_KEYS = ["id", "choices", "created", "model", "system_fingerprint", "object", "usage"]
CHUNK_CHOICE_KEYS = ["finish_reason", "index", "delta", "logprobs"]
DELTA_KEYS = ["content", "role", "tool_calls"]
USAGE_KEYS = [
    "completion_tokens", "prompt_tokens", "total_tokens", "avg_tok_per_sec",
    "avg_prompt_tok_per_sec", "avg_compl_tok_per_sec", "total_time_sec",
    "total_prompt_time_sec", "total_completion_time_sec",
]  # fmt: skip


@pytest.fixture(scope="module")
def runner() -> Iterator[mistralrs.Runner]:
    which: Any = mistralrs.Which.Plain(
        model_id=str(modelgen.ensure_model("tiny")),
        arch=mistralrs.Architecture.Llama,
        dtype=mistralrs.ModelDType.F16,
    )
    yield mistralrs.Runner(which=which, token_source="none")


def _chunks(runner: mistralrs.Runner, **fields: Any) -> list[Any]:
    request = mistralrs.ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], model="default", stream=True,
        temperature=0.0, **fields,
    )  # fmt: skip
    return list(runner.send_chat_completion_request(request))  # type: ignore[arg-type]


def test_chunks_keep_the_servers_key_order_and_nulls(runner: mistralrs.Runner) -> None:
    chunks = [serde.to_wire(c) for c in _chunks(runner, max_tokens=3)]
    for chunk in chunks:
        assert list(chunk) == CHUNK_KEYS
        assert list(chunk["choices"][0]) == CHUNK_CHOICE_KEYS
        assert list(chunk["choices"][0]["delta"]) == DELTA_KEYS
        assert chunk["choices"][0]["delta"]["tool_calls"] is None
        assert chunk["choices"][0]["logprobs"] is None
    assert [c["usage"] is None for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert list(chunks[-1]["usage"]) == USAGE_KEYS
    raw = serde.dumps(chunks[0])
    assert raw.startswith(b'{"id":"') and b'"usage":null}' in raw
    assert json.loads(raw) == chunks[0]


def test_a_stop_sequence_is_written_after_the_finish_reason(runner: mistralrs.Runner) -> None:
    text = "".join(c.choices[0].delta.content or "" for c in _chunks(runner, max_tokens=12))
    stop = text[3:6]
    last = serde.to_wire(_chunks(runner, max_tokens=12, stop_seqs=[stop])[-1])
    choice = last["choices"][0]
    assert list(choice) == ["finish_reason", "stop_sequence", "index", "delta", "logprobs"]
    assert (choice["finish_reason"], choice["stop_sequence"]) == ("stop", stop)


def test_logprobs_are_one_object_per_chunk_with_integer_top_tokens(
    runner: mistralrs.Runner,
) -> None:
    first = serde.to_wire(_chunks(runner, max_tokens=2, logprobs=True, top_logprobs=2)[0])
    logprob = first["choices"][0]["logprobs"]
    assert list(logprob) == ["token", "logprob", "bytes", "top_logprobs"]
    assert isinstance(logprob["bytes"], list)
    assert [list(top) for top in logprob["top_logprobs"]] == [["token", "logprob", "bytes"]] * 2
    assert all(isinstance(top["token"], int) for top in logprob["top_logprobs"])


def test_the_field_order_is_read_from_the_engines_debug_repr(runner: mistralrs.Runner) -> None:
    chunk = _chunks(runner, max_tokens=1)[-1]
    assert serde.field_order(chunk.usage)[:4] == (
        "completion_tokens", "prompt_tokens", "total_tokens", "prompt_tokens_details",
    )  # fmt: skip
    with pytest.raises(TypeError):
        serde.field_order(object())


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (381.64251708984375, "381.64252"),  # the f64 the SDK hands out for an f32
        (1500.0, "1500.0"),
        (0.001, "0.001"),
        (1e-5, "0.00001"),  # ryu's f32 switch to exponents is at 1e-6, Python's at 1e-5
        (1e-7, "1e-7"),
        (1.2e13, "1.2e13"),
        (123456789.0, "123456790.0"),
        (-6.698762, "-6.698762"),
        (0.0, "0.0"),
        (-0.0, "-0.0"),
    ],
)
def test_f32_numbers_are_written_as_ryu_writes_them(value: float, text: str) -> None:
    assert serde.dumps(serde.to_wire(value)) == text.encode()


def test_strings_are_escaped_as_serde_json_escapes_them() -> None:
    assert serde.dumps('a\x00b\n\x1b\x7f\u00e9"\\') == b'"a\\u0000b\\n\\u001b\x7f\xc3\xa9\\"\\\\"'
    assert serde.dumps({"x": [1, True, None, float("nan")]}) == b'{"x":[1,true,null,null]}'
    assert serde.to_wire(float("inf")) is None
