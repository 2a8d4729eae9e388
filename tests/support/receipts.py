"""A plain receipt for the receipt writer's and the chain checker's tests."""

from __future__ import annotations

from typing import Any

from gateway.books.receipts import Receipt


def make_receipt(n: int, created: float = 0.0, **fields: Any) -> Receipt:
    """Request ``req-<n>`` of tenant acme, complete; ``fields`` override the rest."""
    base: dict[str, Any] = {
        "request_id": f"req-{n}",
        "tenant": "acme",
        "subject": "s",
        "endpoint": "chat.completions",
        "serve_identity": None,
        "outcome": "complete",
        "created": created,
    }
    return Receipt(**{**base, **fields})
