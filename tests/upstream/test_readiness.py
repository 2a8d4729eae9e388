"""The pure part of readiness: what a models listing says about one route."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.upstream.readiness import classify

ROUTE = "/models/a"


def _listing(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"object": "list", "data": list(entries)}


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        (_listing({"id": ROUTE, "status": "loaded", "created": 7}), ("loaded", None, 7)),
        (_listing({"id": ROUTE, "status": "unloaded"}), ("unloaded", "unloaded", None)),
        (
            _listing({"id": ROUTE, "status": "reloading", "created": 3}),
            ("reloading", "reloading", 3),
        ),
        (_listing({"id": ROUTE, "status": "dreaming"}), ("dreaming", "bad_body", None)),
        (_listing({"id": ROUTE, "status": 1}), (None, "bad_body", None)),
        (_listing({"id": ROUTE, "status": "loaded", "created": True}), ("loaded", None, None)),
        (_listing({"id": "/models/b", "status": "loaded"}), (None, "route_missing", None)),
        (_listing({"id": ROUTE}, {"id": ROUTE}), (None, "duplicate_route", None)),
        ({"data": "nope"}, (None, "bad_body", None)),
        ([], (None, "bad_body", None)),
    ],
)
def test_classify(listing: Any, expected: tuple[str | None, str | None, int | None]) -> None:
    assert classify(listing, ROUTE) == expected
