"""Fixtures of the state-backend tests (the PostgreSQL servers are in tests/conftest.py)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # The fleet property test is scaled by `make fuzz` (tests/fuzz/budget.py).
    config.addinivalue_line(
        "markers", "fuzz: hypothesis fuzzing; GATEWAY_FUZZ=long (make fuzz) scales the budget"
    )
