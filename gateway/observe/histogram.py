"""Histograms observed on the request path, at a fraction of prometheus_client's cost.

A streamed request observes a dozen histograms (stages, TTFT, duration,
admission wait, the limits store). prometheus_client's ``observe`` takes a
lock per bucket and per sum, which issue 26's profile showed at ~5 % of
the request's CPU. Every observation here happens on the event loop's
thread, so :class:`FastHistogram` keeps plain counts: ``observe`` is a
bisect and two additions. It is a registry collector like any other, and
its exposition is prometheus_client's own, from a
:class:`HistogramMetricFamily`: the same ``_bucket``, ``_count`` and ``_sum``
series (no ``_created``).
A scrape rendered off the loop reads counts while they move: it may see an
observation in ``_sum`` and not yet in its bucket, never a count going back.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class _Child:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, Prometheus's ``le``.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class FastHistogram:
    """``labels(*values).observe(v)`` and ``observe(v)``, as prometheus_client's."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(sorted(float(b) for b in buckets))
        if not bounds or bounds[-1] != math.inf:
            bounds += (math.inf,)
        self._name = name
        self._doc = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = bounds
        self._le = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], _Child] = {}
        if not self._labelnames:
            self._children[()] = _Child(bounds)
        registry.register(self)

    @property
    def labelnames(self) -> tuple[str, ...]:
        return self._labelnames

    def labels(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: expected {len(self._labelnames)} label values")
            child = self._children[values] = _Child(self._bounds)
        return child

    def observe(self, value: float) -> None:
        self._children[()].observe(value)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._le, list(child.counts), strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(list(values), buckets, child.sum)
        yield family
