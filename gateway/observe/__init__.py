"""Metrics, access logs and tracing: each app's own registry, a span seam, OpenTelemetry behind it.

``metrics.py`` (the gateway's metrics on its own ``CollectorRegistry``),
``histogram.py`` and ``exposition.py`` (lock-free request-path histograms),
``access.py`` (what an access line records), ``logs.py``, ``listener.py``
(the separate ``/metrics`` port), ``tracing.py`` (the pure span seam) and
``otel.py`` (OpenTelemetry behind it, optional).

Layer: may import ``config``, ``core`` and ``types``.
"""
