"""Fuzz suites: a small budget in every run, a long one with ``make fuzz``.

Every test under this folder carries the ``fuzz`` marker, registered here
(``pyproject.toml`` stays untouched). ``GATEWAY_FUZZ`` scales the number of
examples: unset → the CI budget, ``long`` → x40, an integer N → xN.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fuzz: hypothesis fuzzing; GATEWAY_FUZZ=long (make fuzz) scales the budget"
    )
