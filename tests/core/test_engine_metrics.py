"""The worker's sequence counts read from its Prometheus exposition (spec §20):
what reads as counts, and what reads as "cannot confirm" (None)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.engine_metrics import COMPLETED, RUNNING, WAITING, EngineCounts, parse

#: what a mistral.rs 0.9.x worker answers on /metrics, trimmed (reference §12)
MISTRALRS = b"""\
# HELP http_requests_total Total HTTP requests
# TYPE http_requests_total counter
http_requests_total{method="POST",path="/v1/chat/completions",model="qwen",status="200"} 17
# HELP http_requests_in_flight HTTP requests in flight
# TYPE http_requests_in_flight gauge
http_requests_in_flight{method="POST",path="/v1/chat/completions",model="qwen"} 2
# HELP http_request_duration_seconds HTTP request duration
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{method="POST",path="/v1/chat/completions",le="0.5"} 3
http_request_duration_seconds_bucket{method="POST",path="/v1/chat/completions",le="+Inf"} 17
http_request_duration_seconds_sum{method="POST",path="/v1/chat/completions"} 40.5
http_request_duration_seconds_count{method="POST",path="/v1/chat/completions"} 17
# HELP mistralrs_tokens_processed_total Tokens processed
# TYPE mistralrs_tokens_processed_total counter
mistralrs_tokens_processed_total 12345

# HELP mistralrs_sequences_running Sequences running
# TYPE mistralrs_sequences_running gauge
mistralrs_sequences_running{model="qwen"} 3
mistralrs_sequences_running{model="llama"} 1
# HELP mistralrs_sequences_waiting Sequences waiting
# TYPE mistralrs_sequences_waiting gauge
mistralrs_sequences_waiting{model="qwen"} 2
mistralrs_sequences_waiting{model="llama"} 0.5
# HELP mistralrs_sequences_completed_total Sequences completed, by reason
# TYPE mistralrs_sequences_completed_total counter
mistralrs_sequences_completed_total{model="qwen",reason="stop"} 40
mistralrs_sequences_completed_total{model="qwen",reason="length"} 7
mistralrs_sequences_completed_total{model="qwen",reason="canceled"} 5
mistralrs_sequences_completed_total{model="llama",reason="canceled"} 2
mistralrs_sequences_completed_total{model="llama",reason="error"} 9
# HELP mistralrs_kv_cache_blocks_used KV cache blocks used
# TYPE mistralrs_kv_cache_blocks_used gauge
mistralrs_kv_cache_blocks_used 64
"""


def _families(running: str = "0", waiting: str = "0", canceled: str = "0") -> bytes:
    return (
        "# TYPE mistralrs_sequences_running gauge\n"
        f"mistralrs_sequences_running {running}\n"
        "# TYPE mistralrs_sequences_waiting gauge\n"
        f"mistralrs_sequences_waiting {waiting}\n"
        "# TYPE mistralrs_sequences_completed_total counter\n"
        f'mistralrs_sequences_completed_total{{reason="canceled"}} {canceled}\n'
    ).encode()


# -- what reads as counts --------------------------------------------------------


def test_a_mistralrs_exposition_sums_each_family_over_its_models() -> None:
    assert parse(MISTRALRS) == EngineCounts(running=4.0, waiting=2.5, canceled=7.0)


def test_only_the_canceled_reason_counts_toward_canceled() -> None:
    text = (
        b"# TYPE mistralrs_sequences_running gauge\n"
        b"mistralrs_sequences_running 0\n"
        b"# TYPE mistralrs_sequences_waiting gauge\n"
        b"mistralrs_sequences_waiting 0\n"
        b"# TYPE mistralrs_sequences_completed_total counter\n"
        b'mistralrs_sequences_completed_total{reason="stop"} 100\n'
        b'mistralrs_sequences_completed_total{reason="length"} 20\n'
        b'mistralrs_sequences_completed_total{reason="error"} 3\n'
        b'mistralrs_sequences_completed_total{reason="canceled"} 4\n'
    )
    assert parse(text) == EngineCounts(0.0, 0.0, 4.0)


def test_completed_with_no_canceled_series_reads_zero_canceled() -> None:
    text = _families(running="1", waiting="2").replace(b'reason="canceled"', b'reason="stop"')
    assert parse(text) == EngineCounts(1.0, 2.0, 0.0)


def test_a_counter_vector_with_only_its_type_line_reads_zero() -> None:
    # A counter vector nobody has incremented yet exports its # TYPE line only.
    text = (
        b"# HELP mistralrs_sequences_running Sequences running\n"
        b"# TYPE mistralrs_sequences_running gauge\n"
        b"mistralrs_sequences_running 2\n"
        b"# TYPE mistralrs_sequences_waiting gauge\n"
        b"mistralrs_sequences_waiting 1\n"
        b"# HELP mistralrs_sequences_completed_total Sequences completed\n"
        b"# TYPE mistralrs_sequences_completed_total counter\n"
    )
    assert parse(text) == EngineCounts(2.0, 1.0, 0.0)


def test_every_family_by_type_line_only_reads_all_zero() -> None:
    text = b"".join(
        b"# TYPE %s %s\n" % (name.encode(), kind)
        for name, kind in ((RUNNING, b"gauge"), (WAITING, b"gauge"), (COMPLETED, b"counter"))
    )
    assert parse(text) == EngineCounts(0.0, 0.0, 0.0)


def test_a_family_counts_as_exported_by_a_sample_without_a_type_line() -> None:
    text = (
        b"mistralrs_sequences_running 1\n"
        b"mistralrs_sequences_waiting 2\n"
        b'mistralrs_sequences_completed_total{reason="canceled"} 3\n'
    )
    assert parse(text) == EngineCounts(1.0, 2.0, 3.0)


def test_a_help_line_alone_does_not_export_a_family() -> None:
    text = _families().replace(
        b"# TYPE mistralrs_sequences_completed_total counter\n"
        b'mistralrs_sequences_completed_total{reason="canceled"} 0\n',
        b"# HELP mistralrs_sequences_completed_total Sequences completed\n",
    )
    assert COMPLETED.encode() in text and b"# TYPE " + COMPLETED.encode() not in text
    assert parse(text) is None


def test_a_timestamp_after_the_value_is_ignored() -> None:
    text = (
        b"# TYPE mistralrs_sequences_running gauge\n"
        b"mistralrs_sequences_running 3 1700000000000\n"
        b"# TYPE mistralrs_sequences_waiting gauge\n"
        b'mistralrs_sequences_waiting{model="a"} 1 1700000000001\n'
        b"# TYPE mistralrs_sequences_completed_total counter\n"
        b'mistralrs_sequences_completed_total{reason="canceled"} 6 1700000000002\n'
    )
    assert parse(text) == EngineCounts(3.0, 1.0, 6.0)


def test_blank_lines_and_surrounding_spaces_are_ignored() -> None:
    text = b"\n\n   \n" + _families("1", "2", "3").replace(b"\n", b"\n\n  \n") + b"\n\n"
    assert parse(text) == EngineCounts(1.0, 2.0, 3.0)
    indented = b"\n".join(b"  " + line + b"  " for line in _families("4", "5", "6").split(b"\n"))
    assert parse(indented) == EngineCounts(4.0, 5.0, 6.0)


def test_crlf_line_ends_read_like_lf() -> None:
    text = MISTRALRS.replace(b"\n", b"\r\n")
    assert b"\r\n" in text
    assert parse(text) == parse(MISTRALRS) == EngineCounts(4.0, 2.5, 7.0)


def test_no_final_newline_still_reads_the_last_sample() -> None:
    text = _families("1", "2", "9").rstrip(b"\n")
    assert parse(text) == EngineCounts(1.0, 2.0, 9.0)


def test_prometheus_value_spellings() -> None:
    assert parse(_families("1e1", "2.5E0", "3.0")) == EngineCounts(10.0, 2.5, 3.0)
    assert parse(_families("0", "0", "-0")) == EngineCounts(0.0, 0.0, 0.0)


def test_families_with_longer_names_are_not_confused_with_the_three() -> None:
    text = (
        b"mistralrs_sequences_running_max 50\n"
        b"mistralrs_sequences_waitingroom 60\n"
        b'mistralrs_sequences_completed_total_created{reason="canceled"} 1.7e9\n'
        b"mistralrs_sequences_capacity 8\n" + _families("1", "2", "3")
    )
    assert parse(text) == EngineCounts(1.0, 2.0, 3.0)


def test_an_empty_label_set_is_a_sample() -> None:
    text = _families().replace(b"mistralrs_sequences_running 0", b"mistralrs_sequences_running{} 4")
    assert parse(text) == EngineCounts(4.0, 0.0, 0.0)


# -- what reads as None: the worker cannot confirm --------------------------------


def test_an_http_only_exposition_is_none() -> None:
    # mistral.rs 0.8.8-0.9.0: /metrics with http_* families only.
    text = (
        b"# HELP http_requests_total Total HTTP requests\n"
        b"# TYPE http_requests_total counter\n"
        b'http_requests_total{method="POST",path="/v1/chat/completions",status="200"} 4\n'
        b"# TYPE http_requests_in_flight gauge\n"
        b"http_requests_in_flight 0\n"
    )
    assert parse(text) is None


@pytest.mark.parametrize("missing", [RUNNING, WAITING, COMPLETED])
def test_any_one_family_missing_is_none(missing: str) -> None:
    kept = b"\n".join(
        line for line in _families("1", "1", "1").split(b"\n") if missing.encode() not in line
    )
    assert missing.encode() not in kept
    assert parse(kept) is None


def test_empty_and_comment_only_bodies_are_none() -> None:
    assert parse(b"") is None
    assert parse(b"\n\r\n  \n") is None
    assert parse(b"# mistralrs\n# HELP mistralrs_sequences_running x\n") is None


@pytest.mark.parametrize(
    ("running", "waiting", "canceled"),
    [
        ("NaN", "0", "0"),
        ("0", "nan", "0"),
        ("0", "0", "NaN"),
        ("-1", "0", "0"),
        ("0", "-0.5", "0"),
        ("0", "0", "-3"),
    ],
)
def test_a_nan_or_negative_count_is_none(running: str, waiting: str, canceled: str) -> None:
    assert parse(_families(running, waiting, canceled)) is None


@pytest.mark.parametrize("value", ["+Inf", "Inf", "1e999"])
def test_an_infinite_count_is_none(value: str) -> None:
    assert parse(_families(canceled=value)) is None


@pytest.mark.parametrize("value", ["abc", "1,5", "0x10", "--1", "1..2", "\u00e9"])
def test_an_unparseable_value_is_none(value: str) -> None:
    assert parse(_families(running=value)) is None
    assert parse(_families(canceled=value)) is None


def test_an_unparseable_value_of_another_reason_is_still_none() -> None:
    text = _families() + b'mistralrs_sequences_completed_total{reason="stop"} garbage\n'
    assert parse(text) is None


def test_a_sample_without_a_value_is_none() -> None:
    text = _families().replace(b"mistralrs_sequences_waiting 0", b"mistralrs_sequences_waiting")
    assert parse(text) is None
    labelled = _families().replace(b'{reason="canceled"} 0', b'{reason="canceled"}')
    assert parse(labelled) is None


def test_an_unclosed_label_brace_is_none() -> None:
    text = _families().replace(b'{reason="canceled"} 0', b'{reason="canceled" 0')
    assert b"}" not in text.split(COMPLETED.encode(), 2)[-1]
    assert parse(text) is None


def test_garbage_in_families_that_do_not_matter_is_ignored() -> None:
    text = (
        b"http_requests_total{method= 12 garbage\n"
        b"mistralrs_tokens_processed_total NaN\n"
        b"mistralrs_kv_cache_blocks_used -4\n"
        b"some_family{unclosed 1\n" + _families("1", "0", "2")
    )
    assert parse(text) == EngineCounts(1.0, 0.0, 2.0)


# -- never raises ----------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    [
        RUNNING,
        WAITING,
        COMPLETED,
        "# TYPE ",
        "# HELP ",
        "#",
        "{",
        "}",
        'reason="canceled"',
        'model="q"',
        ",",
        " ",
        "\t",
        "\n",
        "\r\n",
        "0",
        "1",
        "-2",
        "3.5",
        "NaN",
        "+Inf",
        "-Inf",
        "1e308",
        "1e999",
        "gauge",
        "counter",
        "\x00",
        "\u00e9",
    ]
)


def _check(text: bytes) -> None:
    out = parse(text)
    assert out is None or isinstance(out, EngineCounts)
    if out is not None:
        for value in (out.running, out.waiting, out.canceled):
            assert isinstance(value, float)
            assert value == value and value >= 0  # never NaN, never negative


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_parse_never_raises_on_arbitrary_bytes(text: bytes) -> None:
    _check(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=60).map(lambda parts: "".join(parts).encode()))
def test_parse_never_raises_on_exposition_shaped_noise(text: bytes) -> None:
    _check(text)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
    st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
    st.lists(st.integers(0, 10**6), max_size=4),
    st.lists(st.integers(0, 10**6), max_size=4),
)
def test_sums_match_for_generated_expositions(
    running: list[int], waiting: list[int], canceled: list[int], stopped: list[int]
) -> None:
    lines = ["# TYPE mistralrs_sequences_running gauge"]
    lines += [f'mistralrs_sequences_running{{model="m{i}"}} {v}' for i, v in enumerate(running)]
    lines += ["# TYPE mistralrs_sequences_waiting gauge"]
    lines += [f'mistralrs_sequences_waiting{{model="m{i}"}} {v}' for i, v in enumerate(waiting)]
    lines += ["# TYPE mistralrs_sequences_completed_total counter"]
    lines += [
        f'mistralrs_sequences_completed_total{{model="m{i}",reason="canceled"}} {v}'
        for i, v in enumerate(canceled)
    ]
    lines += [
        f'mistralrs_sequences_completed_total{{model="m{i}",reason="stop"}} {v}'
        for i, v in enumerate(stopped)
    ]
    assert parse("\n".join(lines).encode()) == EngineCounts(
        float(sum(running)), float(sum(waiting)), float(sum(canceled))
    )
