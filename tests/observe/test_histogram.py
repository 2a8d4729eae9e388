"""FastHistogram's exposition is prometheus_client's Histogram's, sample for sample."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.observe.histogram import FastHistogram

_BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0)
_VALUES = st.one_of(
    st.sampled_from([0.0, *_BUCKETS, 2.0]),  # on a bound: counted in that bound's bucket
    st.floats(min_value=0, max_value=100, allow_nan=False),
)


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    ]


@given(st.lists(st.tuples(st.sampled_from(["auth", "plan"]), _VALUES), max_size=60))
def test_the_text_exposition_matches_prometheus_clients(
    observations: list[tuple[str, float]],
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    labelled = Histogram("x_seconds", "doc", ["stage"], buckets=_BUCKETS, registry=theirs)
    plain = Histogram("y_seconds", "doc", buckets=_BUCKETS, registry=theirs)
    fast_labelled = FastHistogram("x_seconds", "doc", ["stage"], buckets=_BUCKETS, registry=ours)
    fast_plain = FastHistogram("y_seconds", "doc", buckets=_BUCKETS, registry=ours)
    for stage, value in observations:
        labelled.labels(stage).observe(value)
        fast_labelled.labels(stage).observe(value)
        plain.observe(value)
        fast_plain.observe(value)
    assert _exposition(ours) == _exposition(theirs)


def test_a_wrong_number_of_label_values_is_refused() -> None:
    histogram = FastHistogram("z_seconds", "doc", ["a", "b"], buckets=_BUCKETS,
                              registry=CollectorRegistry())  # fmt: skip
    with pytest.raises(ValueError, match="label values"):
        histogram.labels("only-one")


def test_a_name_is_registered_once() -> None:
    registry = CollectorRegistry()
    FastHistogram("w_seconds", "doc", buckets=_BUCKETS, registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Histogram("w_seconds", "doc", buckets=_BUCKETS, registry=registry)
