"""The fuzz budget: hypothesis settings scaled by ``GATEWAY_FUZZ``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG_FACTOR = 40


def scale() -> int:
    raw = os.environ.get("GATEWAY_FUZZ", "").strip().lower()
    if raw == "long":
        return LONG_FACTOR
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return 1


def budget(examples: int) -> settings:
    """``examples`` in CI (a few seconds), scaled on demand; no per-example deadline."""
    return settings(
        max_examples=examples * scale(),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )
